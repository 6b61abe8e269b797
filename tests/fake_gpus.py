"""A machine with N fake A100s, for `pyllm` run in a subprocess: a sitecustomize.py that installs a stand-in
``pynvml`` (what NVML would report) and says the build has CUDA. llama-server itself stays the CPU build, which
ignores CUDA_VISIBLE_DEVICES: the tests read what it was given, not what a GPU did with it."""

from __future__ import annotations

import os
from pathlib import Path

SITECUSTOMIZE = '''
import os, sys, types

_n = int(os.environ["PYLLM_TEST_FAKE_GPUS"])
fake = types.ModuleType("pynvml")
fake.NVML_DEVICE_MIG_ENABLE = 1
fake.NVML_CLOCK_MEM = 2


class _Memory:
    total = 80 * 2**30
    free = 79 * 2**30


def _unsupported(*args):
    raise RuntimeError("not supported by the fake")


fake.nvmlInit = lambda: None
fake.nvmlShutdown = lambda: None
fake.nvmlDeviceGetCount = lambda: _n
fake.nvmlDeviceGetHandleByIndex = lambda i: i
fake.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 0)
fake.nvmlDeviceGetMemoryInfo = lambda h: _Memory()
fake.nvmlDeviceGetMigMode = _unsupported
fake.nvmlDeviceGetMemoryBusWidth = _unsupported
fake.nvmlDeviceGetName = lambda h: "NVIDIA A100-SXM4-80GB"
fake.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}-fake-a100"
fake.nvmlSystemGetDriverVersion = lambda: "550.54.15"
fake.nvmlSystemGetCudaDriverVersion_v2 = lambda: 12040
sys.modules["pynvml"] = fake

if os.environ.get("PYLLM_TEST_FAKE_CUDA", "1") == "1":
    import pyllm_a100.llamacpp.native as _native

    _real = _native.build_info

    def _with_cuda():
        return dict(_real(), cuda=True)

    _native.build_info = _with_cuda
    for _name, _module in list(sys.modules.items()):
        if _name.startswith("pyllm_a100") and getattr(_module, "build_info", None) is _real:
            _module.build_info = _with_cuda
'''


def fake_gpu_env(folder: Path, count: int, cuda_build: bool = True) -> dict[str, str]:
    """os.environ plus what makes a `pyllm` subprocess see ``count`` A100s (0..count-1); ``cuda_build=False``
    leaves build_info as it is (this CPU build)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYLLM_TEST_FAKE_GPUS=str(count), PYLLM_TEST_FAKE_CUDA="1" if cuda_build else "0")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env
