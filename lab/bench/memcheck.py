"""Serve a model and put doctor's memory estimate beside what the server really used.

:func:`measure` starts llama-server through :class:`~pyllm_a100.server.Server` at a context per
slot and a slot count, sends one request (CUDA's memory pools grow on first use), and records
per device: the estimate (:mod:`pyllm_a100.memplan`), the buffers llama-server logged (model,
KV, compute), and on GPUs the memory NVML reports used minus the idle figure taken before the
start. tests/test_memplan.py runs it on the CPU (the GPU run that used it: lab.runs.gpu_check at cf107d3).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from pyllm_a100.models.gguf_files import resolve_model
from pyllm_a100.planning.memplan import estimate_vs_measured, local_shape

log = logging.getLogger(__name__)


def _used_mib() -> list[float]:
    from pyllm_a100.devices.gpus import visible_gpus

    return [(g.memory_total - g.memory_free) / 2**20 for g in visible_gpus()]


def measure(model: str | os.PathLike[str], ctx: int, parallel: int, *, tensor_split: str | None = None,
            n_gpu_layers: int | None = None, log_path: str | os.PathLike[str] | None = None,
            ready_timeout: float = 1800, n_predict: int = 8) -> dict[str, Any]:
    """Estimate vs measured memory for ``model`` served at ``ctx`` tokens per slot x ``parallel`` slots."""
    import httpx

    from pyllm_a100.serve.server import Server

    files = resolve_model(model)
    shape = local_shape(files)
    gpu = n_gpu_layers != 0 and _gpu_build_with_gpus()  # a CPU build runs everything on the CPU whatever -ngl says
    n_gpus = 0
    if gpu:
        from pyllm_a100.devices.splits import parse_tensor_split

        n_gpus = len(parse_tensor_split(tensor_split)) if tensor_split else 1
    idle = _used_mib() if gpu else []
    started = time.monotonic()
    log_path = Path(log_path) if log_path else None
    with Server(files.first, port=0, ctx_size=ctx * parallel, parallel=parallel, tensor_split=tensor_split,
                n_gpu_layers=n_gpu_layers, ready_timeout=ready_timeout, log_path=log_path, extra_args=["-lv", "4"]) as srv:
        ready = time.monotonic() - started
        loaded = _used_mib() if gpu else []
        reply = httpx.post(srv.base_url + "/completion", timeout=600,
                           json={"prompt": "Hello", "n_predict": n_predict, "temperature": 0, "ignore_eos": True}).json()
        after = _used_mib() if gpu else []
        text = srv.log_text()
        # the cache serve built: most models share one pool (--kv-unified), one stream the attention sees whole
        est_ctx, est_slots = srv.config.capacity.streams if srv.config.capacity else (ctx, parallel)
    used = [a - i for a, i in zip(after, idle)][:n_gpus] if gpu else None
    result = estimate_vs_measured(shape, text, est_ctx, est_slots, n_gpus, used_mib=used)
    result.update(model=str(files.first), bytes=files.total_bytes, tensor_split=tensor_split, ready_seconds=round(ready, 1),
                  tokens=reply.get("tokens_predicted"), memory_idle_mib=idle, memory_loaded_mib=loaded,
                  memory_after_request_mib=after)
    return result


def _gpu_build_with_gpus() -> bool:
    from pyllm_a100.devices.gpus import visible_gpus
    from pyllm_a100.llamacpp.native import build_info

    return bool(build_info().get("cuda")) and bool(visible_gpus())
