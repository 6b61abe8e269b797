"""pyllm-a100: the 2026 MoE models on NVIDIA A100/A800 through a pinned llama.cpp.

``Llama`` is llama-cpp-python's class bound to the library this package built;
``Server`` is a managed llama-server. Importing this package points llama-cpp-python
at our libllama (``LLAMA_CPP_LIB_PATH``) before anything imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .llamacpp import bindings as _bindings
from .llamacpp.native import build_info

__version__ = "0.1.0"
__all__ = ["Llama", "Server", "build_info", "__version__"]

_bindings.point_at_native_library()

if TYPE_CHECKING:
    from .embedded import Llama
    from .serve.server import Server


def __getattr__(name: str) -> Any:
    # Lazy: `pyllm --help` should not import numpy and ctypes bindings.
    if name == "Llama":
        from .embedded import Llama

        return Llama
    if name == "Server":
        from .serve.server import Server

        return Server
    raise AttributeError(f"module 'pyllm_a100' has no attribute {name!r}")
