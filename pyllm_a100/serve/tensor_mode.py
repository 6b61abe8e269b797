"""``--split-mode tensor``: which models llama.cpp can split by tensor, and what the mode requires.

Tensor split puts a slice of every layer on each GPU and all-reduces after each block (NCCL when the
build found it). At the pin it needs flash attention, an F16/BF16/F32 KV cache and ``--fit off``
(llama_params_fit is not implemented for it); the architectures it refuses are those of the pin's
``llm_arch_supports_sm_tensor`` (src/llama-arch.cpp), read at build time into build_info.json's
``sm_tensor_unsupported``: that list is the one source of truth, never a list of our own.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..llamacpp.native import build_info
from ..errors import ServerConfigError

FLASH_ATTN = ("-fa", "--flash-attn")
FIT = ("-fit", "--fit")
CACHE_TYPES = (("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v"))
SPLIT_MODE = ("-sm", "--split-mode")
UNQUANTIZED_KV = ("f16", "bf16", "f32")


def flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value the last of ``names`` gets in ``args`` (``-fa on`` or ``--flash-attn=on``), or None."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in names:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
    return value


def unsupported_architectures() -> list[str] | None:
    """What this build's llama.cpp refuses under tensor split; None when the build did not record it."""
    return build_info().get("sm_tensor_unsupported")


def check(architecture: str, extra_args: Sequence[str], n_gpus: int) -> None:
    """Refuse, in one line each, what llama-server would reject (or run wrongly) under --split-mode tensor."""
    fa = flag_value(extra_args, FLASH_ATTN)
    if fa is not None and fa.lower() not in ("on", "1", "true", "auto"):
        raise ServerConfigError(f"--split-mode tensor needs flash attention, but the extra arguments turn it {fa or 'off'}: "
                                "drop that -fa (pyllm serve turns it on)")
    for names in CACHE_TYPES:
        kind = flag_value(extra_args, names)
        if kind is not None and kind.lower() not in UNQUANTIZED_KV:
            raise ServerConfigError(f"--split-mode tensor needs an unquantized KV cache, not {names[1]} {kind}: "
                                    f"use one of {', '.join(UNQUANTIZED_KV)} (or leave it out: f16)")
    fit = flag_value(extra_args, FIT)
    if fit is not None and fit.lower() != "off":
        raise ServerConfigError(f"--split-mode tensor cannot be combined with --fit {fit} (llama.cpp's fitting does not "
                                "implement tensor split): drop it; pyllm serve passes --fit off and --ctx-size")
    refused = unsupported_architectures()
    if refused is not None and architecture in refused:
        raise ServerConfigError(
            f"--split-mode tensor: this llama.cpp ({build_info().get('llama_cpp_commit')}) does not implement tensor "
            f"split for {architecture} (llm_arch_supports_sm_tensor): use --split-mode layer (the default)")
    if n_gpus < 1:
        raise ServerConfigError("--split-mode tensor splits every layer across CUDA GPUs, and this build or machine has none "
                                "(llama.cpp leaves the CPU out of tensor parallelism): use --split-mode layer (the default)")


def argv_defaults(extra_args: Sequence[str]) -> list[str]:
    """What pyllm serve adds under tensor split unless the extra arguments already say it."""
    out: list[str] = []
    if flag_value(extra_args, FLASH_ATTN) is None:
        out += ["--flash-attn", "on"]
    if flag_value(extra_args, FIT) is None:
        out += ["--fit", "off"]
    return out
