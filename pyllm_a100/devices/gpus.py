"""The NVIDIA GPUs this process may use, through NVML (nvidia-ml-py).

``CUDA_VISIBLE_DEVICES`` is respected the way CUDA applies it: indices or UUIDs, in the
order given, stopping at the first entry that names no device.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping, Sequence

from ..errors import GpuSelectionError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GPU:
    index: int  # index as CUDA numbers it inside this process
    physical_index: int
    name: str
    uuid: str
    compute_capability: str  # "8.0"
    memory_total: int  # bytes
    memory_free: int
    mig_enabled: bool
    memory_bandwidth: float | None = None  # bytes/s, the memory bus at its maximum clock (NVML)

    @property
    def sm(self) -> str:
        return self.compute_capability.replace(".", "")


@dataclasses.dataclass(frozen=True)
class Driver:
    version: str
    cuda_version: str  # highest CUDA the driver supports, "13.0"


def _visible(all_gpus: list[GPU], spec: str | None = None) -> list[GPU]:
    """The GPUs a CUDA_VISIBLE_DEVICES value (default: this process's) shows, renumbered from 0."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES") if spec is None else spec
    if spec is None:
        return all_gpus
    chosen: list[GPU] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            break
        match = None
        if entry.lstrip("-").isdigit():
            idx = int(entry)
            match = next((g for g in all_gpus if g.physical_index == idx), None)
        else:
            match = next((g for g in all_gpus if g.uuid.startswith(entry) or g.uuid == "GPU-" + entry), None)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return [dataclasses.replace(g, index=i) for i, g in enumerate(chosen)]


def _nvml():
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.debug("NVML unavailable: %s", exc)
        return None
    return pynvml


def driver() -> Driver | None:
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        version = nvml.nvmlSystemGetDriverVersion()
        cuda = nvml.nvmlSystemGetCudaDriverVersion_v2()
        return Driver(version=str(version), cuda_version=f"{cuda // 1000}.{(cuda % 1000) // 10}")
    finally:
        nvml.nvmlShutdown()


def visible_gpus(present: Sequence[GPU] | None = None) -> list[GPU]:
    """GPUs CUDA would show this process; empty without a driver. ``present``: NVML's list, when already asked."""
    return _visible(list(nvml_gpus() if present is None else present))


def nvml_gpus() -> list[GPU]:
    """Every GPU NVML sees, whatever CUDA_VISIBLE_DEVICES says, numbered as nvidia-smi numbers them."""
    nvml = _nvml()
    if nvml is None:
        return []
    try:
        found = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                mig = nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE
            except Exception:  # not supported on this GPU
                mig = False
            try:  # bus width (bits) x maximum memory clock (MHz) x 2 (double data rate)
                bandwidth = nvml.nvmlDeviceGetMemoryBusWidth(handle) / 8 * nvml.nvmlDeviceGetMaxClockInfo(
                    handle, nvml.NVML_CLOCK_MEM) * 1e6 * 2
            except Exception:  # not reported (some virtual GPUs)
                bandwidth = None
            name = nvml.nvmlDeviceGetName(handle)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            found.append(GPU(
                index=i, physical_index=i,
                name=name.decode() if isinstance(name, bytes) else name,
                uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                compute_capability=f"{major}.{minor}",
                memory_total=int(memory.total), memory_free=int(memory.free), mig_enabled=bool(mig),
                memory_bandwidth=bandwidth,
            ))
        return found
    finally:
        nvml.nvmlShutdown()


# --- choosing GPUs for one server: pyllm serve --gpus 0-3 ------------------------------------------

GPU_LIST_EXAMPLES = "0-3, 4-7, 0,1 or 2"
_TERM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_gpu_list(text: str) -> list[int]:
    """``"0-3"`` -> ``[0, 1, 2, 3]``; ``"0,2"``, ``"4-7"``, ``"2"``; order kept. One-line errors for
    anything else: not a number or range, a range that runs backwards, a GPU named twice, nothing."""
    shown = str(text).strip()
    if not shown:
        raise GpuSelectionError(f"--gpus is empty: give GPU numbers as nvidia-smi shows them, e.g. {GPU_LIST_EXAMPLES}")
    if re.fullmatch(r"\s*\d+\s*x\s*\d+(\.\d+)?\s*", shown):
        raise GpuSelectionError(f"--gpus {shown}: COUNTxGIB is pyllm doctor's memory-plan form; here give GPU numbers "
                                f"as nvidia-smi shows them, e.g. {GPU_LIST_EXAMPLES}")
    chosen: list[int] = []
    for term in shown.split(","):
        match = _TERM.match(term)
        if match is None:
            raise GpuSelectionError(f"--gpus {shown}: {term.strip()!r} is not a GPU number or a range N-M; "
                                    f"use e.g. {GPU_LIST_EXAMPLES}")
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if high < low:
            raise GpuSelectionError(f"--gpus {shown}: the range {low}-{high} runs backwards; write {high}-{low}")
        for index in range(low, high + 1):
            if index in chosen:
                raise GpuSelectionError(f"--gpus {shown}: GPU {index} is named twice; name each GPU once")
            chosen.append(index)
    return chosen


def format_gpu_list(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 3]`` -> ``"0-3"``, ``[0, 2, 3]`` -> ``"0,2-3"`` (what ps shows; parse_gpu_list reads it back)."""
    out: list[str] = []
    run: list[int] = []
    for index in list(indices) + [None]:  # type: ignore[list-item]
        if run and index is not None and index == run[-1] + 1:
            run.append(index)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [index] if index is not None else []
    return ",".join(out)


def select_gpus(text: str | Sequence[int], present: Sequence[GPU], environ: Mapping[str, str] | None = None) -> list[GPU]:
    """The GPUs ``--gpus`` names, checked against ``present`` (:func:`nvml_gpus`): each must exist and,
    when this environment has CUDA_VISIBLE_DEVICES, be one of those it shows. Numbers are nvidia-smi's
    (NVML's, in PCI bus order); the child gets them with CUDA_DEVICE_ORDER=PCI_BUS_ID (:func:`child_env`)."""
    shown = text if isinstance(text, str) else format_gpu_list(text)
    indices = parse_gpu_list(shown) if isinstance(text, str) else list(text)
    if not indices:
        raise GpuSelectionError(f"--gpus is empty: give GPU numbers as nvidia-smi shows them, e.g. {GPU_LIST_EXAMPLES}")
    if len(set(indices)) != len(indices):
        raise GpuSelectionError(f"--gpus {shown}: a GPU is named twice; name each GPU once")
    if not present:
        raise GpuSelectionError(f"--gpus {shown}: NVML sees no NVIDIA GPU on this machine (no driver, or no GPU): "
                                "check nvidia-smi, or leave --gpus out to run on the CPU")
    by_index = {g.physical_index: g for g in present}
    missing = [i for i in indices if i not in by_index]
    if missing:
        raise GpuSelectionError(f"--gpus {shown}: no GPU {format_gpu_list(missing)} on this machine (NVML sees "
                                f"{len(present)}: {format_gpu_list(sorted(by_index))}); see nvidia-smi")
    env = os.environ if environ is None else environ
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        visible = {g.physical_index for g in _visible(list(present), env["CUDA_VISIBLE_DEVICES"])}
        hidden = [i for i in indices if i not in visible]
        if hidden:
            raise GpuSelectionError(
                f"--gpus {shown}: GPU {format_gpu_list(hidden)} is hidden by CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} "
                f"in this environment (visible: {format_gpu_list(sorted(visible)) or 'none'}); unset it, or choose among those")
    return [by_index[i] for i in indices]


def child_env(indices: Sequence[int], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default: os.environ, never changed) in which CUDA shows only these GPUs, numbered
    the way nvidia-smi and --gpus number them (PCI bus order, not CUDA's default fastest-first)."""
    env = dict(os.environ if base is None else base)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in indices)
    return env

