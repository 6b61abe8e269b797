"""The NVIDIA GPUs this process may use, through NVML (nvidia-ml-py).

``CUDA_VISIBLE_DEVICES`` is respected the way CUDA applies it: indices or UUIDs, in the
order given, stopping at the first entry that names no device.
"""

from __future__ import annotations

import dataclasses
import logging
import os

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


def _visible(all_gpus: list[GPU]) -> list[GPU]:
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
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


def visible_gpus() -> list[GPU]:
    """GPUs CUDA would show this process; empty without a driver."""
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
        return _visible(found)
    finally:
        nvml.nvmlShutdown()
