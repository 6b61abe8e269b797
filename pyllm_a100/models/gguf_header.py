"""GGUF headers read by ggml's own parser (libggml-base's gguf_* API, through ctypes).

Why not the `gguf` package here: its reader turns every element of every array into
numpy objects, which takes ~5 s for a DeepSeek-V4 vocabulary (129,280 tokens and as many
merges) on every `pyllm serve`, doctor and Llama start. ggml's parser reads the same
header in milliseconds, and it is the code llama.cpp itself will load the model with.
The `gguf` package stays the writer (pyllm synth) and the tests' independent reader.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from pathlib import Path
from typing import Any

from ..llamacpp.native import native_dir

# gguf.h: enum gguf_type
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(native_dir() / "libggml-base.so"))
    sig = {
        "gguf_init_from_file": (ctypes.c_void_p, [ctypes.c_char_p, _InitParams]),
        "gguf_free": (None, [ctypes.c_void_p]),
        "gguf_get_n_kv": (ctypes.c_int64, [ctypes.c_void_p]),
        "gguf_get_key": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_kv_type": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_arr_type": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_arr_n": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_val_str": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_val_data": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_arr_data": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_data_offset": (ctypes.c_size_t, [ctypes.c_void_p]),
        "gguf_get_alignment": (ctypes.c_size_t, [ctypes.c_void_p]),
        "gguf_get_n_tensors": (ctypes.c_int64, [ctypes.c_void_p]),
        "gguf_get_tensor_offset": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_tensor_size": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_tensor_type": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
        "gguf_get_tensor_name": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_int64]),
        "ggml_type_name": (ctypes.c_char_p, [ctypes.c_int]),
        "ggml_log_set": (None, [ctypes.c_void_p, ctypes.c_void_p]),
        "ggml_log_get": (None, [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_SCALARS = {
    U8: ctypes.c_uint8, I8: ctypes.c_int8, U16: ctypes.c_uint16, I16: ctypes.c_int16, U32: ctypes.c_uint32,
    I32: ctypes.c_int32, F32: ctypes.c_float, BOOL: ctypes.c_bool, U64: ctypes.c_uint64, I64: ctypes.c_int64,
    F64: ctypes.c_double,
}


@dataclasses.dataclass(frozen=True)
class Header:
    metadata: dict[str, Any]  # scalar keys, and numeric arrays as lists (string arrays: their length)
    tensor_count: int
    tensor_types: dict[str, int]  # "Q8_0" -> number of tensors
    data_end: int  # where the last tensor's data ends: the file must be at least this long
    tensor_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # name -> bytes in the file


_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class HeaderError(ValueError):
    """ggml could not parse the header; the message is ggml's own reason."""


def _parse(path: Path) -> int:
    """gguf_init_from_file with ggml's log captured (it would print parse errors to stderr)."""
    lib = _lib()
    messages: list[str] = []
    capture = _LOG_CALLBACK(lambda level, text, user: messages.append(text.decode("utf-8", "replace").strip()) if text else None)
    old_cb, old_ud = ctypes.c_void_p(), ctypes.c_void_p()
    lib.ggml_log_get(ctypes.byref(old_cb), ctypes.byref(old_ud))
    lib.ggml_log_set(ctypes.cast(capture, ctypes.c_void_p), None)
    try:
        ctx = lib.gguf_init_from_file(str(path).encode(), _InitParams(True, None))
    finally:
        lib.ggml_log_set(old_cb, old_ud)
    if not ctx:
        reason = next((m.split(": ", 1)[-1] for m in messages if m), "unknown reason")
        raise HeaderError(reason)
    return ctx


def read_header(path: Path) -> Header:
    """The header of a GGUF file (HeaderError when ggml cannot parse it: not GGUF, cut inside the header)."""
    lib = _lib()
    ctx = _parse(path)
    try:
        metadata: dict[str, Any] = {}
        for i in range(lib.gguf_get_n_kv(ctx)):
            key = lib.gguf_get_key(ctx, i).decode("utf-8", errors="replace")
            kind = lib.gguf_get_kv_type(ctx, i)
            if kind == STR:
                metadata[key] = lib.gguf_get_val_str(ctx, i).decode("utf-8", errors="replace")
            elif kind in _SCALARS:
                metadata[key] = _SCALARS[kind].from_address(lib.gguf_get_val_data(ctx, i)).value
            elif kind == ARR:
                sub, n = lib.gguf_get_arr_type(ctx, i), lib.gguf_get_arr_n(ctx, i)
                if sub in _SCALARS and n <= 4096:
                    data = (_SCALARS[sub] * n).from_address(lib.gguf_get_arr_data(ctx, i)) if n else []
                    metadata[key] = list(data)
                else:
                    metadata[key + ".length"] = n
        types: dict[str, int] = {}
        sizes: dict[str, int] = {}
        end = 0
        n_tensors = lib.gguf_get_n_tensors(ctx)
        for t in range(n_tensors):
            name = lib.ggml_type_name(lib.gguf_get_tensor_type(ctx, t)).decode().upper()
            types[name] = types.get(name, 0) + 1
            size = lib.gguf_get_tensor_size(ctx, t)
            sizes[lib.gguf_get_tensor_name(ctx, t).decode("utf-8", errors="replace")] = size
            end = max(end, lib.gguf_get_tensor_offset(ctx, t) + size)
        return Header(metadata, n_tensors, types, lib.gguf_get_data_offset(ctx) + end if n_tensors else 0, sizes)
    finally:
        lib.gguf_free(ctx)
