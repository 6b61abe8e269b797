"""Known llama.cpp failures, translated into one line that says what to change."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

# Log lines worth showing when nothing more specific matched.
_INTERESTING = re.compile(r"error|failed|exception|abort|fatal|out of memory|what\(\)", re.IGNORECASE)


def tail(text: str, n: int = 3, window: int = 40) -> str:
    """The telling lines among the last ``window`` lines (never older ones: they rarely explain the end)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("=== pyllm-a100")][-window:]
    picked = [ln for ln in lines if _INTERESTING.search(ln)][-n:] or lines[-n:]
    return " | ".join(picked)


# ggml-cuda's CUDA_CHECK: "CUDA error: <text>" then "  current device: N, in function F at FILE:LINE".
_CUDA_ERROR = re.compile(
    r"CUDA error: (?P<error>[^\n]+?)\s*\n\s*current device: (?P<device>-?\d+), in function (?P<function>\w+) at (?P<file>[^\n]+?):(?P<line>\d+)"
)
# Backtrace frames naming a ggml-cuda function: gdb (demangled, "in f(...)" or "f (...) at"), or
# backtrace_symbols / dladdr (mangled "_Z<len><name>...").
_FRAME = re.compile(r"(?:_Z(?P<len>\d+))?(?P<name>ggml_cuda_\w+)")
_NOT_THE_KERNEL = {"ggml_cuda_error", "ggml_cuda_kernel_launch", "ggml_cuda_set_device", "ggml_cuda_get_device"}


def cuda_abort(log: str) -> dict[str, str] | None:
    """The CUDA error llama-server aborted on: error text, device, where it was caught, and the
    ggml-cuda operation whose launch failed (the first such frame of the backtrace)."""
    m = _CUDA_ERROR.search(log)
    if not m:
        return None
    found = {"error": m["error"].strip(), "device": m["device"], "function": m["function"],
             "where": f"{Path(m['file'].strip()).name}:{m['line']}", "kernel": ""}
    for line in log[m.end():].splitlines()[:200]:
        for frame in _FRAME.finditer(line):
            name = frame["name"][: int(frame["len"])] if frame["len"] else frame["name"]
            if name not in _NOT_THE_KERNEL and name != found["function"]:
                found["kernel"] = name
                return found
    return found


def _logs_hint(log_path: Path | None) -> str:
    """`pyllm logs NAME` for a managed server's log, else the log's path."""
    if log_path is not None:
        try:
            from ..home import servers_dir

            if log_path.parent.parent == servers_dir():
                return f"`pyllm logs {log_path.parent.name}`"
        except Exception:  # an unusable PYLLM_HOME must not hide the real error
            pass
        return str(log_path)
    return "the server log"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _mib(text: str) -> float:
    return float(text)


def explain(log: str, code: int | None, config: Any = None, *, log_path: Path | None = None) -> str:
    """One line: what went wrong (from the log), then what to do."""
    where = f" (log: {log_path})" if log_path else ""
    status = _exit_text(code)
    model = getattr(config, "model", None)

    m = re.search(r"allocating ([\d.]+) MiB on device (\d+): cudaMalloc failed: out of memory", log) or re.search(
        r"failed to allocate (CUDA\d+) buffer of size (\d+)", log
    )
    if m or re.search(r"CUDA error: out of memory|cudaMalloc failed: out of memory|unable to allocate CUDA\d+ buffer", log):
        size = ""
        if m and m.re.pattern.startswith("allocating"):
            size = f" allocating {float(m[1]) / 1024:.1f} GiB on CUDA{m[2]}"
        elif m:
            size = f" allocating {int(m[2]) / 2**30:.1f} GiB on {m[1]}"
        total = f"; the model alone is {model.total_bytes / 2**30:.1f} GiB" if model else ""
        ctx = f" (now {config.effective_ctx})" if config is not None else ""
        return (
            f"llama-server ran out of GPU memory{size}{total}: lower --ctx-size{ctx}, spread over more GPUs "
            f"(--tensor-split 1x8), or use a smaller quantization; `pyllm doctor MODEL` estimates the fit{where}"
        )
    if "no kernel image is available for execution on the device" in log:
        from ..devices.gpus import visible_gpus
        from ..llamacpp.native import build_info

        archs = ",".join(build_info().get("cuda_architectures") or []) or "none"
        gpus = ", ".join(f"{g.name} (sm_{g.sm})" for g in visible_gpus()) or "the GPU"
        return (
            f"this build has CUDA code for sm {archs} only, which cannot run on {gpus}: reinstall with "
            f"-C cmake.define.CMAKE_CUDA_ARCHITECTURES=\"{archs};<your GPU's sm>\"{where}"
        )
    if code is not None and code < 0 and -code == signal.SIGKILL:
        return f"llama-server was killed by SIGKILL (by the OOM killer or a user); `dmesg | tail` tells which{where}"
    cuda = cuda_abort(log)
    if cuda:
        inside = cuda["kernel"] or cuda["function"]
        caught = f" ({cuda['function']}, {cuda['where']})" if cuda["kernel"] else f" ({cuda['where']})"
        return (
            f"llama-server aborted: CUDA error '{cuda['error']}' in {inside}{caught} on CUDA{cuda['device']}: a fault in "
            f"llama.cpp's CUDA code or the driver, not in your request; report it to llama.cpp with the log "
            f"({_logs_hint(log_path)}) and the request that triggered it"
        )
    if "Remote RPC server crashed or returned malformed response" in log or re.search(r"Failed to connect to \S+:\d+", log):
        m = re.search(r"Failed to connect to (\S+:\d+)", log)
        workers = m[1] if m else ", ".join(map(str, getattr(config, "rpc", []) or [])) or "an rpc-server"
        return (
            f"llama-server lost its RPC worker(s) ({workers}): a worker died or the network dropped; restart the worker "
            f"(pyllm rpc-worker ...; `pyllm doctor --rpc {workers}` checks them), then the server{where}"
        )
    m = re.search(r"unknown model architecture: '([^']+)'", log)
    if m:
        return (
            f"this llama.cpp does not know the model architecture '{m[1]}': the source is older than the model; "
            f"build a newer one with pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE=/path/to/llama.cpp -r requirements.txt .{where}"
        )
    if re.search(r"couldn't bind HTTP server socket|Address already in use", log):
        port = getattr(config, "port", "?")
        return f"port {port} is already in use: pass another --port, or stop the server using it (pyllm ps){where}"
    m = re.search(r"(?:failed to open|cannot open|No such file)[^\n]*?([^\s'\"]+-\d{5}-of-\d{5}\.gguf)", log)
    if m:
        return f"a shard of the model is missing: {m[1]}; download the whole set (pyllm fetch resumes){where}"
    if re.search(r"Permission denied", log):
        return f"llama-server cannot read the model (permission denied): fix the file's permissions (chmod a+r){where}"
    return f"llama-server stopped ({status}): {tail(log)}{where}"
