"""Bind llama-cpp-python to the libllama this package built, or refuse clearly.

llama-cpp-python reads ``LLAMA_CPP_LIB_PATH`` (and ``MTMD_CPP_LIB``) once, at import.
``import pyllm_a100`` sets them; :func:`llama_cpp_module` then checks that the library
really loaded is ours and that the bindings match its ABI (``llama.h``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from types import ModuleType

from .errors import BindingsError, NativeBuildNotFound
from .native import build_info, native_dir

log = logging.getLogger(__name__)

LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"
MTMD_PATH_ENV = "MTMD_CPP_LIB"
ALLOW_ABI_MISMATCH_ENV = "PYLLM_ALLOW_ABI_MISMATCH"


def point_at_native_library() -> None:
    """Make a later ``import llama_cpp`` load our libllama (no-op without a build)."""
    try:
        directory = str(native_dir())
    except NativeBuildNotFound:
        return
    previous = os.environ.get(LIB_PATH_ENV)
    if previous and Path(previous).resolve() != Path(directory):
        log.warning("%s=%s replaced by pyllm-a100's build at %s", LIB_PATH_ENV, previous, directory)
    os.environ[LIB_PATH_ENV] = directory
    os.environ[MTMD_PATH_ENV] = directory


def loaded_library(module: ModuleType) -> Path:
    """The libllama file a ``llama_cpp.llama_cpp`` module has loaded."""
    return Path(module._lib._name).resolve()


def llama_cpp_module() -> ModuleType:
    """``llama_cpp``, guaranteed to run on this package's libllama with a matching ABI."""
    ours = (native_dir() / "libllama.so").resolve()
    already = sys.modules.get("llama_cpp.llama_cpp")
    if already is None:
        point_at_native_library()
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as low_level
    except ImportError as exc:
        raise BindingsError(
            f"llama-cpp-python is not installed ({exc}): pip install -r requirements.txt "
            "(it installs the bindings without compiling llama.cpp a second time)"
        ) from exc
    loaded = loaded_library(low_level)
    if loaded != ours:
        raise BindingsError(
            f"llama_cpp was imported before pyllm_a100 and loaded {loaded}, not this package's {ours}: "
            f"import pyllm_a100 before llama_cpp, or start Python with {LIB_PATH_ENV}={ours.parent}"
        )
    check_abi(llama_cpp.__version__)
    return llama_cpp


def check_abi(bindings_version: str) -> None:
    """Refuse bindings whose llama.h differs from the one our library was built from."""
    info = build_info()
    pin = info.get("pin", {})
    if os.environ.get(ALLOW_ABI_MISMATCH_ENV) == "1":
        return
    if bindings_version != pin.get("version"):
        raise BindingsError(
            f"llama-cpp-python {bindings_version} is installed but this build pins {pin.get('version')}: "
            "pip install -r requirements.txt to get the matching bindings"
        )
    if info.get("llama_h_sha256") != pin.get("llama_h_sha256"):
        raise BindingsError(
            f"this build's llama.h (source {info.get('source')}) differs from the one llama-cpp-python "
            f"{bindings_version} was written for, so in-process calls could crash: use `pyllm serve` "
            f"(no bindings involved), rebuild from the pinned source, or set {ALLOW_ABI_MISMATCH_ENV}=1 "
            "if you have checked the ABI yourself"
        )
