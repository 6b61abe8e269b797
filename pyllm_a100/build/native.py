"""Where the compiled llama.cpp lives, and what was built (build_info.json)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from ..errors import NativeBuildNotFound

NATIVE_DIR_ENV = "PYLLM_NATIVE_DIR"
BUILD_INFO = "build_info.json"


def _candidates() -> list[Path]:
    found = []
    override = os.environ.get(NATIVE_DIR_ENV)
    if override:
        found.append(Path(override).expanduser())
    found.append(Path(__file__).resolve().parents[1] / "_native")  # pyllm_a100/_native
    return found


@functools.lru_cache(maxsize=None)
def _native_dir(override: str | None) -> Path:
    tried = _candidates()
    for candidate in tried:
        if (candidate / BUILD_INFO).is_file():
            return candidate.resolve()
    raise NativeBuildNotFound(
        "no llama.cpp build found (tried: "
        + ", ".join(str(p) for p in tried)
        + "): install the package with its native build (pip install -r requirements.txt .), "
        + f"or point {NATIVE_DIR_ENV} at a folder holding build_info.json and llama-server"
    )


def native_dir() -> Path:
    """The folder holding llama-server, rpc-server, libllama.so, libggml*.so and build_info.json."""
    return _native_dir(os.environ.get(NATIVE_DIR_ENV))


def binary(name: str) -> Path:
    """Path of a shipped executable (``llama-server``, ``rpc-server``, ``llama-bench``)."""
    path = native_dir() / name
    if not path.is_file():
        raise NativeBuildNotFound(
            f"{name} is not in the llama.cpp build at {native_dir()}: reinstall the package (pip install -r requirements.txt .)"
        )
    return path


def library_path() -> Path:
    return native_dir() / "libllama.so"


def build_info() -> dict[str, Any]:
    """build_info.json plus where things are on this machine."""
    directory = native_dir()
    info = json.loads((directory / BUILD_INFO).read_text())
    info["native_dir"] = str(directory)
    info["server_path"] = str(directory / "llama-server")
    info["rpc_server_path"] = str(directory / "rpc-server")
    info["library_path"] = str(directory / "libllama.so")
    return info
