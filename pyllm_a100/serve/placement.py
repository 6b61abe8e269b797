"""Where a request's model goes: the devices llama.cpp will see, listed once, and the split checked against them.

NVML is asked once (every GPU, then the ones CUDA shows or --gpus chose) and each RPC worker once (its handshake,
its devices and their memory, on one connection: rpc.protocol.probe); the devices come back in the model's order,
the workers' first, which ``--tensor-split`` follows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..devices import gpus as nvml
from ..devices.splits import check_against_devices
from ..errors import GpuSelectionError
from ..llamacpp.native import build_info
from ..models.gguf_files import ModelFiles
from ..rpc.devices import Device, list_devices
from . import tensor_mode
from .options import ServeOptions
from .validate import Parsed


@dataclasses.dataclass(frozen=True)
class Placement:
    """The model's devices in llama.cpp's order, and the local GPUs among what NVML showed (``local``)."""

    devices: tuple[Device, ...]
    local: tuple[Any, ...]  # devices.gpus.GPU: the GPUs this server may use (CUDA builds only)
    visible: int  # GPUs visible to it (what a split without workers is counted against)


def place(options: ServeOptions, parsed: Parsed, files: ModelFiles) -> Placement:
    """The devices for ``files``; a split, --gpus or tensor mode that cannot work here is one line."""
    present = nvml.nvml_gpus()
    chosen = None
    if parsed.gpus is not None:
        chosen = nvml.select_gpus(options.gpus, present)
        if not build_info().get("cuda"):
            raise GpuSelectionError(f"--gpus {nvml.format_gpu_list(parsed.gpus)}: this llama.cpp build has no CUDA (CPU "
                                    "only), so llama-server cannot use a GPU: reinstall with CUDA (see README), or "
                                    "leave --gpus out")
    visible = chosen if chosen is not None else nvml.visible_gpus(present)
    local = tuple(visible) if build_info().get("cuda") else ()
    devices = tuple(list_devices(parsed.rpc, local))
    if parsed.flags.value("split_mode") == "tensor":
        tensor_mode.check(files.architecture, parsed.flags, len(local) + len(parsed.rpc))
    if parsed.tensor_split is not None:
        given = [g.physical_index for g in chosen] if chosen is not None else None
        parts, text = list(parsed.tensor_split), str(options.tensor_split)
        if parsed.rpc:  # local GPUs and the workers' devices together, as llama.cpp counts them
            check_against_devices(parts, len(devices), text=text, gpus=given, found=[d.label for d in devices])
        else:
            check_against_devices(parts, len(visible), text=text, gpus=given)
    return Placement(devices, local, len(visible))
