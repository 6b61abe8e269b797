"""Steps row split, two-gpu and two-gpu in-process: --split-mode row, and the real-shape deepseek-v4-flash served and
loaded in-process with --tensor-split 1x2."""

from __future__ import annotations

import re
import time
from pathlib import Path

from .compare import in_process
from .runner import LOGS, RESULTS, gpu_memory, step


@step("row split")
def row_split(models: Path) -> dict:
    """Does --split-mode row load these architectures (tune found it failing on deepseek4)? The log says why."""
    from pyllm_a100.serve.server import Server
    from pyllm_a100.synth import synthesize

    out = {}
    for preset, wtype in (("tiny-deepseek4", "f16"), ("tiny-deepseek4", "ud-q8-k-xl"), ("tiny-glm-dsa", "f16"), ("tiny-llama", "f16")):
        model = models / f"{preset}-{wtype}.gguf"
        if not model.exists():
            synthesize(preset, model, weight_type=wtype, seed=42)
        log = LOGS / f"row-{preset}-{wtype}.log"
        try:
            with Server(model, port=0, ctx_size=512, split_mode="row", tensor_split="1x2", log_path=log, ready_timeout=300):
                out[f"{preset} {wtype}"] = {"loaded": True}
        except Exception as exc:  # the reason is in llama-server's log
            lines = log.read_text(errors="replace").splitlines()
            out[f"{preset} {wtype}"] = {"loaded": False, "error": str(exc)[:300],
                                        "log": [ln for ln in lines if " E " in ln or "error" in ln.lower()][-8:]}
    return out



@step("two-gpu")
def two_gpus(models: Path, layers: int) -> dict:
    import httpx

    from pyllm_a100.devices.gpus import visible_gpus
    from pyllm_a100.serve.server import Server
    from pyllm_a100.synth import synthesize

    n_gpus = len(visible_gpus())
    split = "1x2" if n_gpus >= 2 else None  # one GPU: the same model unsplit (the split run needs nvidia-h200-x2)
    RESULTS["two_gpu_split_run"] = split is not None
    written = synthesize("deepseek-v4-flash", models / f"v4f-{layers}l.gguf", layers=layers, seed=42)  # lab/benchmarks/gpu.py reuses it
    RESULTS["v4_model"] = {"layers": layers, "bytes": written.bytes_written, "write_seconds": round(written.seconds, 1)}
    idle = gpu_memory()
    log = LOGS / f"v4f-{split or '1gpu'}.log"
    started = time.monotonic()
    with Server(written.first, port=0, ctx_size=4096, tensor_split=split, ready_timeout=900, log_path=log,
                extra_args=["-lv", "4"]) as srv:
        ready = time.monotonic() - started
        loaded = gpu_memory()
        first = httpx.post(srv.base_url + "/completion", timeout=600, json={
            "prompt": "Hello", "n_predict": 32, "temperature": 0, "ignore_eos": True}).json()
        # the first request pays PTX JIT for kernels not used while loading; the second is the speed
        reply = httpx.post(srv.base_url + "/completion", timeout=600, json={
            "prompt": "Hello again, " * 20, "n_predict": 64, "temperature": 0, "ignore_eos": True}).json()
    text = log.read_text(errors="replace")
    buffers = re.findall(r"(CUDA\d|CPU(?:_Mapped)?) model buffer size = +([\d.]+) MiB", text)
    offloaded = re.findall(r"offloaded (\d+)/(\d+) layers to GPU", text)
    per_device_layers = re.findall(r"layer +(\d+) assigned to device (CUDA\d)", text)
    return {
        "gpus": n_gpus, "tensor_split": split,
        "model": {"layers": layers, "bytes": written.bytes_written, "write_seconds": round(written.seconds, 1)},
        "ready_seconds": round(ready, 1),
        "memory_idle_mib": idle, "memory_loaded_mib": loaded,
        "model_buffers_mib": buffers, "offloaded": offloaded,
        "layers_per_device": {d: sum(1 for _, dev in per_device_layers if dev == d) for d in sorted({d for _, d in per_device_layers})},
        "first_request_timings": first.get("timings"),
        "reply_tokens": reply.get("tokens_predicted"), "timings": reply.get("timings"),
    }


@step("two-gpu in-process")
def two_gpus_in_process(models: Path, layers: int) -> dict:
    from pyllm_a100.synth import synthesize

    model = models / f"v4f-{layers}l.gguf"
    if not model.exists():
        synthesize("deepseek-v4-flash", model, layers=layers, seed=42)
    before = gpu_memory()
    split = "1x2" if len(before) >= 2 else None
    local = in_process(model, True, split=split)
    return {"load_seconds": round(local["load_seconds"], 1), "tokens": local["tokens"], "memory_before_mib": before,
            "memory_loaded_mib": local["memory_used_mib"], "tensor_split": split}
