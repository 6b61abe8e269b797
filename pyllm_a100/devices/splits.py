"""Tensor-split syntax: ``1x8`` (eight equal parts), ``3,1``, ``2x2,1x4``.

Parsed once here; serve, Llama and doctor all use :func:`parse_tensor_split`.
"""

from __future__ import annotations

import re

from ..errors import TensorSplitError

_TERM = re.compile(r"^\s*(?P<weight>\d+(?:\.\d+)?)\s*(?:x\s*(?P<count>\d+))?\s*$")
EXAMPLES = "1x8 (eight equal parts), 3,1 or 2x2,1x4"


def parse_tensor_split(text: str | list[float] | tuple[float, ...]) -> list[float]:
    """``"2x2,1x4"`` -> ``[2, 2, 1, 1, 1, 1]``; lists pass through after validation."""
    if isinstance(text, (list, tuple)):
        parts = [float(p) for p in text]
    else:
        parts = []
        for term in str(text).split(","):
            match = _TERM.match(term)
            if match is None:
                raise TensorSplitError(f"--tensor-split {text}: {term.strip()!r} is not WEIGHT or WEIGHTxCOUNT; use e.g. {EXAMPLES}")
            count = int(match["count"]) if match["count"] is not None else 1
            if count < 1:
                raise TensorSplitError(f"--tensor-split {text}: the count after x must be at least 1; use e.g. {EXAMPLES}")
            parts.extend([float(match["weight"])] * count)
    if not parts:
        raise TensorSplitError(f"--tensor-split is empty; use e.g. {EXAMPLES}")
    if any(p < 0 for p in parts) or sum(parts) <= 0:
        raise TensorSplitError(f"--tensor-split {text}: weights must be non-negative and not all zero")
    return parts


def check_against_devices(parts: list[float], n_devices: int, *, text: str = "", gpus: list[int] | None = None,
                          found: list[str] | None = None) -> None:
    """More parts than visible devices is a mistake llama.cpp would silently ignore. ``gpus``: the ones
    --gpus chose (nvidia-smi numbers), counted instead of every visible GPU. ``found``: with --rpc, the model's
    devices in llama.cpp's order (the workers' devices, then local GPUs, described), which the message names."""
    shown = text or ",".join(f"{p:g}" for p in parts)
    if found is not None:
        if len(parts) > len(found):
            seen = ", ".join(found) if found else "none"
            raise TensorSplitError(
                f"--tensor-split {shown} has {len(parts)} parts but llama.cpp sees {len(found)} device(s), --rpc "
                f"workers and local GPUs together, in its order: {seen}: use 1x{len(found)}, or start more workers "
                "(pyllm rpc-worker)")
        return
    if gpus is not None and len(parts) > n_devices:
        from .gpus import format_gpu_list

        chosen = format_gpu_list(gpus)
        raise TensorSplitError(
            f"--tensor-split {shown} has {len(parts)} parts but --gpus {chosen} chose {len(gpus)} GPU(s)"
            + (f" ({n_devices} device(s) with the --rpc workers)" if n_devices != len(gpus) else "")
            + f": use 1x{n_devices}, or choose more GPUs"
        )
    if n_devices == 0:
        raise TensorSplitError(
            f"--tensor-split {shown}: no GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
            "leave --tensor-split out to run on the CPU"
        )
    if len(parts) > n_devices:
        raise TensorSplitError(
            f"--tensor-split {shown} has {len(parts)} parts but {n_devices} device(s) are available "
            f"(GPUs visible through CUDA_VISIBLE_DEVICES, plus --rpc workers): use 1x{n_devices}, or add devices"
        )


def to_llama_arg(parts: list[float]) -> str:
    """The comma list llama-server's ``--tensor-split`` takes."""
    return ",".join(f"{p:g}" for p in parts)
