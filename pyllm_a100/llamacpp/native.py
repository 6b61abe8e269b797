"""Where the compiled llama.cpp lives, and what was built (build_info.json)."""

from __future__ import annotations

import functools
import importlib.metadata
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


def shadowed_install() -> Path | None:
    """The installed package's build folder when this pyllm_a100 was imported from a source checkout instead.

    Python puts the current folder first on sys.path: ``python -c 'import pyllm_a100'`` in the repository root
    imports the checkout (pyproject.toml beside it, no _native inside), not the installed package.
    """
    package = Path(__file__).resolve().parents[1]
    if not (package.parent / "pyproject.toml").is_file() or (package / "_native").exists():
        return None
    try:
        installed = Path(importlib.metadata.distribution("pyllm-a100").locate_file("pyllm_a100")).resolve()
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    native = installed / "_native"
    return native if installed != package and (native / BUILD_INFO).is_file() else None


@functools.lru_cache(maxsize=None)
def _native_dir(override: str | None) -> Path:
    tried = _candidates()
    for candidate in tried:
        if (candidate / BUILD_INFO).is_file():
            return candidate.resolve()
    installed = None if override else shadowed_install()
    if installed is not None:
        checkout = Path(__file__).resolve().parents[2]
        raise NativeBuildNotFound(
            f"pyllm_a100 was imported from the source checkout {checkout} (the current folder comes first on "
            f"Python's path), which has no llama.cpp build, instead of the installed package: run from another "
            f"folder (cd ~), or set {NATIVE_DIR_ENV}={installed}"
        )
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
