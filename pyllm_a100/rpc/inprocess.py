"""RPC workers' devices for models loaded in this process (``Llama(rpc=...)``), as llama-server's ``--rpc`` adds them.

llama.cpp registers a worker's devices for the whole process (``ggml_backend_register``), and a model given no device
list loads onto every registered device. So once a worker has been added here, every model pyllm's ``Llama`` loads
gets its device list explicitly: the workers it asked for first (llama.cpp's own order for ``--rpc``), then this
machine's GPUs; a ``Llama`` without ``rpc=`` stays off the workers another one added.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence

from ..errors import RpcError
from ..llamacpp.native import native_dir
from .devices import in_model_order
from .protocol import hello

_lock = threading.Lock()
_added: dict[str, list[int]] = {}  # endpoint -> its devices (ggml_backend_dev_t), in the worker's order
_GPU, _IGPU = 1, 2  # enum ggml_backend_dev_type (ggml-backend.h)


def _library(name: str) -> ctypes.CDLL:
    """One of this build's ggml libraries (libllama has loaded it already: the same handle)."""
    return ctypes.CDLL(str(native_dir() / name))


@functools.cache
def _ggml() -> ctypes.CDLL:
    lib = _library("libggml.so")
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_dev_name.restype = ctypes.c_char_p
    lib.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


@functools.cache
def _rpc() -> ctypes.CDLL:
    lib = _library("libggml-rpc.so")
    lib.ggml_backend_rpc_add_server.restype = ctypes.c_void_p
    lib.ggml_backend_rpc_add_server.argtypes = [ctypes.c_char_p]
    return lib


def add_workers(endpoints: Sequence[object]) -> list[int]:
    """The devices of these rpc-server workers, registered once per process; each worker must answer the RPC
    handshake first (a dead worker is one line, never an abort inside llama.cpp)."""
    ggml = _ggml()
    rpc = _rpc()
    devices: list[int] = []
    with _lock:
        for endpoint in endpoints:
            key = str(endpoint)
            if key not in _added:
                hello(endpoint)
                reg = rpc.ggml_backend_rpc_add_server(key.encode())
                if not reg:
                    raise RpcError(f"the rpc-server at {key} reports no device: start it with the devices to offer "
                                   "(pyllm rpc-worker --devices ...)")
                ggml.ggml_backend_register(reg)
                _added[key] = [ggml.ggml_backend_reg_dev_get(reg, i) for i in range(ggml.ggml_backend_reg_dev_count(reg))]
            devices += _added[key]
    return devices


def any_added() -> bool:
    """Whether this process has registered a worker's devices (then every model gets an explicit device list)."""
    return bool(_added)


def local_gpus() -> list[int]:
    """This machine's GPU devices as llama.cpp lists them for a model: GPUs, else integrated GPUs; no worker's."""
    ggml = _ggml()
    workers = {d for devs in _added.values() for d in devs}
    devices = [ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count())]
    devices = [d for d in devices if d not in workers and not (ggml.ggml_backend_dev_name(d) or b"").startswith(b"RPC")]
    gpus = [d for d in devices if ggml.ggml_backend_dev_type(d) == _GPU]
    return gpus or [d for d in devices if ggml.ggml_backend_dev_type(d) == _IGPU]


def model_devices(endpoints: Sequence[object] | None) -> list[int] | None:
    """A model's device list, in the order llama.cpp gives a model its devices (devices.in_model_order): the workers'
    first, then this machine's GPUs; None (llama.cpp's default: every registered device) while no worker was
    added in this process and none is asked."""
    if endpoints is None:
        return local_gpus() if any_added() else None
    workers = add_workers(endpoints)
    return in_model_order(workers + local_gpus(), set(workers).__contains__)


def device_array(devices: Sequence[int]) -> ctypes.Array:
    """A NULL-terminated ggml_backend_dev_t array (llama_model_params.devices); keep it alive while loading."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
