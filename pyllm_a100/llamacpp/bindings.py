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

from ..errors import BindingsError, NativeBuildNotFound
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
    install_log_callback(low_level)
    return llama_cpp


# ggml_log_level (ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the previous line)
_LEVELS = {0: logging.CRITICAL, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_callback = None
_last_level = logging.INFO
llama_log = logging.getLogger("pyllm_a100.llamacpp")
verbose_logs = False  # set by Llama(verbose=True): llama.cpp's log goes to stderr as it comes


def install_log_callback(low_level: ModuleType) -> None:
    """Replace llama-cpp-python's log callback with one that cannot raise.

    Its callback decodes each chunk as strict UTF-8, but llama.cpp cuts long metadata
    previews at a byte count, mid-character (DeepSeek's vocabulary is full of 3-byte
    characters): every model load then raised inside a C callback. Ours decodes with
    replacement, shows errors (everything when verbose), and hands the rest to logging.
    """
    global _callback
    if _callback is not None:
        return

    @low_level.llama_log_callback
    def callback(level: int, text: bytes, user_data: object) -> None:
        global _last_level
        try:
            message = text.decode("utf-8", errors="replace") if text else ""
            py_level = _last_level if level == 5 else _LEVELS.get(level, logging.INFO)
            _last_level = py_level
            if verbose_logs or py_level >= logging.ERROR:
                sys.stderr.write(message)
                sys.stderr.flush()
            elif llama_log.isEnabledFor(py_level):
                llama_log.log(py_level, "%s", message.rstrip("\n"))
        except Exception:  # a logging failure must never propagate into C
            pass

    low_level.llama_log_set(callback, None)
    _callback = callback


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
