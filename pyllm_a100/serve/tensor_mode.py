"""``--split-mode tensor``: which models llama.cpp can split by tensor, and what the mode requires.

Tensor split puts a slice of every layer on each GPU and all-reduces after each block (NCCL when the build found
it). At the pin it needs flash attention, an F16/BF16/F32 KV cache and ``--fit off`` (llama_params_fit is not
implemented for it: argv.tensor_defaults passes those unless the user's flags say otherwise); the architectures it
refuses are the pin's ``llm_arch_supports_sm_tensor`` (src/llama-arch.cpp), read at build time into
build_info.json's ``sm_tensor_unsupported``: that list is the one source of truth, never a list of our own.
"""

from __future__ import annotations

from ..errors import ServerConfigError
from ..llamacpp.native import build_info
from .llama_flags import UserFlags, long_name

UNQUANTIZED_KV = ("f16", "bf16", "f32")


def check(architecture: str, flags: UserFlags, n_devices: int) -> None:
    """Refuse, in one line each, what llama-server would reject (or run wrongly) under --split-mode tensor;
    ``n_devices``: the CUDA GPUs and RPC workers it would split over."""
    fa = flags.value("flash_attn")
    if fa is not None and fa.lower() not in ("on", "1", "true", "auto"):
        raise ServerConfigError(f"--split-mode tensor needs flash attention, but the extra arguments turn it {fa or 'off'}: "
                                "drop that -fa (pyllm serve turns it on)")
    for key in ("cache_type_k", "cache_type_v"):
        kind = flags.value(key)
        if kind is not None and kind.lower() not in UNQUANTIZED_KV:
            raise ServerConfigError(f"--split-mode tensor needs an unquantized KV cache, not {long_name(key)} {kind}: "
                                    f"use one of {', '.join(UNQUANTIZED_KV)} (or leave it out: f16)")
    fit = flags.value("fit")
    if fit is not None and fit.lower() != "off":
        raise ServerConfigError(f"--split-mode tensor cannot be combined with --fit {fit} (llama.cpp's fitting does not "
                                "implement tensor split): drop it; pyllm serve passes --fit off and --ctx-size")
    refused = build_info().get("sm_tensor_unsupported")
    if refused is not None and architecture in refused:
        raise ServerConfigError(
            f"--split-mode tensor: this llama.cpp ({build_info().get('llama_cpp_commit')}) does not implement tensor "
            f"split for {architecture} (llm_arch_supports_sm_tensor): use --split-mode layer (the default)")
    if n_devices < 1:
        raise ServerConfigError("--split-mode tensor splits every layer across CUDA GPUs, and this build or machine has none "
                                "(llama.cpp leaves the CPU out of tensor parallelism): use --split-mode layer (the default)")
