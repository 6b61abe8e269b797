"""Serving steps: the serving soak (OUT/gpu-serving.json) of the tiny presets and of the real-shape V4, the real-shape
GLM-5 (glm5, soak glm5), the speculative drafts, doctor, the memory plan against measured memory, and nvfp4."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from . import runner
from .compare import compare
from .runner import LOGS, RESULTS, gpu_memory, save, step

SOAK_TYPES = ("f16", "q8_0", "q4_0", "ud-q8-k-xl")
NMSE_LENGTHS = (1, 2, 4, 5, 7, 8, 9, 12, 13, 16, 31, 33, 64)
SERVING: dict = {"cases": [], "nmse": []}

SCORES = r"""
import json, sys
import numpy as np
from pyllm_a100 import Llama
job = json.loads(sys.argv[1])
llm = Llama(job["model"], n_ctx=512, n_batch=512, n_ubatch=512, n_gpu_layers=job["ngl"], tensor_split=job.get("split"),
            logits_all=True, verbose=False)
for name, prompt in job["prompts"].items():  # each prompt evaluated as one batch: that batch size's kernels
    llm.reset()
    llm.eval(prompt)
    np.save(f"{job['dir']}/{name}.npy", np.array(llm.scores[:len(prompt)], dtype=np.float64))
print("done")
"""


def length_nmse(model: Path, lengths: tuple[int, ...], split: str | None = None) -> dict:
    """Teacher-forced logits (every position of the prompt) GPU vs CPU, per prompt length."""
    import numpy as np

    from lab.bench.soak import prompt_ids
    from pyllm_a100.models.gguf_files import resolve_model

    n_vocab = resolve_model(model).n_vocab
    prompts = {str(n): prompt_ids(n, n, n_vocab) for n in lengths}
    dirs = {}
    for side, gpu in (("cpu", False), ("gpu", True)):
        dirs[side] = Path(f"/tmp/nmse/{model.stem}/{side}")
        dirs[side].mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **({} if gpu else {"CUDA_VISIBLE_DEVICES": ""}))
        job = {"model": str(model), "ngl": 999 if gpu else 0, "split": split if gpu else None, "prompts": prompts,
               "dir": str(dirs[side])}
        run = subprocess.run([sys.executable, "-c", SCORES, json.dumps(job)], capture_output=True, text=True, env=env,
                             cwd="/tmp", timeout=900)
        (LOGS / f"nmse-{model.stem}-{side}.log").write_text(run.stdout + run.stderr)
        if run.returncode:
            return {"error": f"{side} exit {run.returncode}: {run.stderr.strip()[-400:]}"}
    out = {}
    for name in prompts:
        a, b = np.load(dirs["cpu"] / f"{name}.npy"), np.load(dirs["gpu"] / f"{name}.npy")
        out[name] = float(np.mean((a - b) ** 2) / np.mean(a ** 2))
    return {"lengths": out, "max": max(out.values())}


def save_serving() -> None:
    cases = SERVING["cases"]
    SERVING["totals"] = {"cases": len(cases), "requests": sum(c.get("requests", 0) for c in cases),
                         "http_errors": sum(c.get("http_errors", 0) for c in cases),
                         "crashes": sum(c.get("crashes", 0) for c in cases),
                         "failed_cases": [f"{c['preset']} {c['type']} parallel {c['parallel']}" for c in cases
                                          if c.get("crashes") or c.get("http_errors") or c.get("error")]}
    SERVING["environment"] = RESULTS["steps"].get("environment", {}).get("result")
    SERVING["dispatch"] = runner.dispatch_record()  # issue 41: native or a100, and what llama.cpp reported
    SERVING["reported_capability"] = SERVING["dispatch"]["reported_capability"]
    SERVING["build"] = {k: (RESULTS["steps"].get("build-info", {}).get("result") or {}).get(k)
                        for k in ("llama_cpp_commit", "patches", "cuda", "cuda_architectures", "cuda_version")}
    (runner.OUT / "gpu-serving.json").write_text(json.dumps(SERVING, indent=2, default=str))


def soak_case(model: Path, preset: str, wtype: str, parallel: int | None, **options) -> dict:
    from lab.bench.soak import soak

    label = f"{preset}-{wtype}-p{parallel or 'default'}{'-' + options['tensor_split'] if options.get('tensor_split') else ''}"
    print(f"   soak {label}", flush=True)
    try:
        result = soak(model, parallel=parallel, n_gpu_layers=999, log_path=LOGS / f"soak-{label}.log", **options)
    except Exception as exc:  # a server that never starts is a failed case, not a lost step
        result = {"error": f"{type(exc).__name__}: {exc}"[:600], "crashes": 0, "http_errors": 0, "requests": 0}
    case = {"preset": preset, "type": wtype, "parallel": parallel or "default", "gpus": options.get("tensor_split") or "1", **result}
    SERVING["cases"].append(case)
    save_serving()
    return case


def check_soak() -> dict:
    totals = SERVING["totals"]
    if totals["crashes"] or totals["http_errors"] or totals["failed_cases"]:
        raise RuntimeError(f"serving soak: {totals['crashes']} crash(es), {totals['http_errors']} HTTP error(s) in "
                           f"{totals['failed_cases']}")
    return totals


@step("serving soak")
def serving_soak(models: Path, presets: list[str]) -> dict:
    from pyllm_a100.synth import synthesize

    SERVING["started"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for preset in presets:
        for wtype in SOAK_TYPES:
            model = models / f"{preset}-{wtype}.gguf"
            if not model.exists():
                synthesize(preset, model, weight_type=wtype, seed=42)
            for parallel in (None, 16):
                soak_case(model, preset, wtype, parallel)
            SERVING["nmse"].append({"preset": preset, "type": wtype, **length_nmse(model, NMSE_LENGTHS)})
            save_serving()
    save_serving()
    return check_soak()


@step("serving soak v4")
def serving_soak_v4(models: Path, layers: int) -> dict:
    """The real-shape DeepSeek-V4 (UD-like mix) over two GPUs, the same soak."""
    from pyllm_a100.synth import synthesize

    model = models / f"v4f-{layers}l.gguf"
    if not model.exists():
        synthesize("deepseek-v4-flash", model, layers=layers, seed=42)
    split = "1x2" if len(gpu_memory()) >= 2 else None
    for parallel in (None, 16):
        soak_case(model, f"deepseek-v4-flash-{layers}l", "ud-q8-k-xl", parallel, **({"tensor_split": split} if split else {}))
    SERVING["nmse"].append({"preset": f"deepseek-v4-flash-{layers}l", "type": "ud-q8-k-xl", "tensor_split": split,
                            **length_nmse(model, (1, 8, 12, 33), split=split)})
    save_serving()
    return check_soak()


FIELD_REQUESTS = {  # the field report's two requests against GLM-5.2 (issue 18): Chinese arithmetic, a tool call
    "chinese_arithmetic": {"messages": [{"role": "user", "content": "请计算：1234 乘以 5678 等于多少？请给出计算过程。"}],
                           "max_tokens": 64, "temperature": 0},
    "get_weather_tool_call": {
        "messages": [{"role": "user", "content": "What is the weather like in Beijing today?"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Get the current weather of a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "city name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}],
        "tool_choice": "auto", "max_tokens": 64, "temperature": 0},
}


@step("glm5")
def glm5(models: Path, layers: int | None, experts: int | None, wtype: str, ctx: int, parallel: int,
         preset: str = "glm-5") -> dict:
    """The real GLM-5 shape (cut to LAYERS layers, EXPERTS routed experts each) on two GPUs: load, memory, the field's
    two requests, prefill/decode, the HBM-ceiling fraction and the serving soak."""
    import httpx

    from pyllm_a100.bench import throughput as bench
    from pyllm_a100.devices.gpus import visible_gpus
    from pyllm_a100.models.gguf_files import resolve_model
    from pyllm_a100.models.memplan import logged_buffers
    from pyllm_a100.models.roofline import weights_per_token
    from pyllm_a100.serve.server import Server
    from pyllm_a100.synth import synthesize

    model = models / f"glm5-{layers}l-e{experts}-{wtype}.gguf"
    made = None
    if not model.exists():
        made = synthesize(preset, model, layers=layers, experts=experts, weight_type=wtype, seed=42)
    gpus = visible_gpus()
    split = "1x2" if len(gpus) >= 2 else None
    idle = gpu_memory()
    log = LOGS / f"glm5-{layers}l.log"
    started = time.monotonic()
    result: dict = {"model": {"preset": preset, "layers": layers, "experts": experts, "type": wtype,
                              "bytes": model.stat().st_size, "write_seconds": round(made.seconds, 1) if made else None},
                    "tensor_split": split, "ctx_size": ctx, "parallel": parallel}
    with Server(model, port=0, ctx_size=ctx, parallel=parallel, tensor_split=split, ready_timeout=900, log_path=log,
                extra_args=["-lv", "4"]) as srv:  # -lv 4: the load log names every buffer size
        result["ready_seconds"] = round(time.monotonic() - started, 1)
        loaded = gpu_memory()
        result["memory_idle_mib"], result["memory_loaded_mib"] = idle, loaded
        result["memory_used_by_server_mib"] = [b["used_mib"] - a["used_mib"] for a, b in zip(idle, loaded)]
        answers = {}
        for name, body in FIELD_REQUESTS.items():
            t0 = time.monotonic()
            r = httpx.post(srv.base_url + "/v1/chat/completions", json=body, timeout=900,
                           headers={"Authorization": f"Bearer {srv.api_key}"} if getattr(srv, "api_key", None) else {})
            data = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            choice = (data.get("choices") or [{}])[0]
            answers[name] = {"status": r.status_code, "seconds": round(time.monotonic() - t0, 1),
                             "finish_reason": choice.get("finish_reason"), "usage": data.get("usage"),
                             "content": ((choice.get("message") or {}).get("content") or "")[:200],
                             "tool_calls": (choice.get("message") or {}).get("tool_calls")}
        result["field_requests"] = answers
        speed = {}
        for prompt_tokens in [n for n in (512, 2048) if n + 128 <= ctx // parallel]:
            row = bench.run(srv.base_url, prompt_tokens=prompt_tokens, gen_tokens=128, concurrency=1, repeat=2,
                            api_key=getattr(srv, "api_key", None))
            speed[f"p{prompt_tokens}"] = row.as_row()
        result["speed"] = speed
    text = log.read_text(errors="replace")
    result["buffers_mib"] = logged_buffers(text)  # MiB per device and kind, as llama-server logged them
    result["offloaded"] = re.findall(r"offloaded (\d+)/(\d+) layers to GPU", text)
    per_device_layers = re.findall(r"layer +(\d+) assigned to device (CUDA\d)", text)
    result["layers_per_device"] = {d: sum(1 for _, dev in per_device_layers if dev == d) for d in sorted({d for _, d in per_device_layers})}
    weights = weights_per_token(resolve_model(model))
    bandwidth = min((g.memory_bandwidth for g in gpus if g.memory_bandwidth), default=None)
    decode = result["speed"]["p512"]["decode_tps"]
    result["roofline"] = {"active_bytes_per_token": weights.active_bytes, "total_bytes": weights.total_bytes,
                          "bandwidth_bytes_per_s": bandwidth,
                          "ceiling_tps": round(weights.ceiling_tokens_per_second(bandwidth), 1) if bandwidth else None,
                          "fraction_of_ceiling": round(decode / weights.ceiling_tokens_per_second(bandwidth), 3) if bandwidth else None}
    RESULTS["glm5"] = result
    return result


@step("soak glm5")
def soak_glm5(models: Path, layers: int, experts: int, wtype: str) -> dict:
    model = models / f"glm5-{layers}l-e{experts}-{wtype}.gguf"
    split = "1x2" if len(gpu_memory()) >= 2 else None
    SERVING.setdefault("started", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    soak_case(model, f"glm-5-{layers}l-e{experts}", wtype, None, **({"tensor_split": split} if split else {}))
    return check_soak()


DRAFT_PAIRS = (("tiny-deepseek4", "tiny-deepseek4-dspark"), ("tiny-deepseek4", "tiny-deepseek4-mtp"),
               ("tiny-glm-dsa", "tiny-glm-dsa-mtp"), ("tiny-deepseek32", "tiny-deepseek32-mtp"),
               ("tiny-glm-dsa-nextn", "tiny-glm-dsa-nextn"))  # the model's own MTP block (--draft naming the model)


@step("drafts")
def drafts(models: Path, layers: int, pairs: tuple = DRAFT_PAIRS,
           real: tuple[str, str] = ("deepseek-v4-flash", "deepseek-v4-flash-dspark")) -> dict:
    """Greedy tokens with == without each synthetic draft; the real-shape V4 with its DSpark draft at 7 tokens."""
    from pyllm_a100.bench.draft_exactness import compare
    from pyllm_a100.synth import synthesize

    RESULTS["drafts"] = out = {"tiny": [], "real_shape": None}
    for target, draft in pairs:
        for name in (target, draft):
            if not (models / f"{name}.gguf").exists():
                synthesize(name, models / f"{name}.gguf", seed=42)
        print(f"   {target} + {draft}", flush=True)
        try:
            result = compare(models / f"{target}.gguf", models / f"{draft}.gguf", n_predict=32,
                             log_path=LOGS / f"drafts-{draft}.log", ready_timeout=900)
        except Exception as exc:  # one pair that cannot start is a failed pair, not a lost step
            result = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        out["tiny"].append({"target": target, "draft_preset": draft, **result})
        save()
    if layers:
        stem = "v4f" if real[0] == "deepseek-v4-flash" else real[0]  # v4f-4l.gguf is the two-gpu step's file too
        model, draft = models / f"{stem}-{layers}l.gguf", models / f"{stem}-{layers}l-dspark.gguf"
        if not model.exists():
            synthesize(real[0], model, layers=layers, seed=42)
        if not draft.exists():
            synthesize(real[1], draft, layers=layers, seed=42)
        split = {"tensor_split": "1x2"} if len(gpu_memory()) >= 2 else {}
        print(f"   {real[0]} {layers} layers + {real[1]}, 7 draft tokens", flush=True)
        try:
            out["real_shape"] = compare(model, draft, n_predict=128, draft_max=7, repeats=3, ready_timeout=1800,
                                        log_path=LOGS / "drafts-v4-real-shape.log", **split)
            out["real_shape"].update(preset=real[0], draft_preset=real[1], layers=layers, **split)
        except Exception as exc:
            out["real_shape"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        save()
    failed = [r.get("draft_preset", "?") for r in out["tiny"] if not r.get("equal") or not r.get("draft_n")]
    if out["real_shape"] and (out["real_shape"].get("error") or not out["real_shape"].get("equal")):
        failed.append(real[1])
    summary = {"pairs": len(out["tiny"]) + bool(out["real_shape"]), "failed": failed,
               "real_shape": {k: (out["real_shape"] or {}).get(k) for k in
                              ("equal", "draft_n", "draft_n_accepted", "acceptance", "tokens_per_s_plain",
                               "tokens_per_s_draft", "speedup", "error")}}
    if failed:
        raise RuntimeError(f"drafts: tokens differ, no draft used, or no start for {failed}")
    return summary


@step("doctor")
def doctor(model: Path) -> dict:
    from pyllm_a100.doctor import gather

    return gather(str(model), 8192)


@step("memory plan")
def memory_plan(models: Path, model: Path | None, ctx: int, parallel: int) -> dict:
    """Doctor's memory estimate beside the measured memory per GPU (NVML used minus idle, after one request) and the
    buffers llama-server logged, for MODEL served with --tensor-split 1xN over every GPU at CTX per slot x PARALLEL.
    Without --memplan-model: glm-5 cut to 4 layers with 8 experts in ud-q8-k-xl (3.5 GB) and tiny-glm-dsa."""
    from lab.bench.memcheck import measure
    from pyllm_a100.doctor import memory_plan as plan
    from pyllm_a100.synth import synthesize

    n = len(gpu_memory())
    split = f"1x{n}" if n >= 2 else None
    cases = []
    if model is None:
        small = models / "glm5-4l-8e-ud.gguf"
        if not small.exists():
            synthesize("glm-5", small, layers=4, experts=8, weight_type="ud-q8-k-xl", seed=42)
        tiny = models / "tiny-glm-dsa.gguf"
        if not tiny.exists():
            synthesize("tiny-glm-dsa", tiny, seed=42)
        targets = [small, tiny]
    else:
        targets = [model]
    for target in targets:
        label = target.stem
        print(f"   memory plan {label}: {ctx} x {parallel}, split {split}", flush=True)
        case = measure(target, ctx, parallel, tensor_split=split, n_gpu_layers=999, log_path=LOGS / f"memplan-{label}.log")
        case["doctor_plan"] = plan(str(target), f"{max(n, 1)}x{int(gpu_memory()[0]['total_mib'] / 1024) if n else 80}", ctx, parallel)
        cases.append(case)
        RESULTS.setdefault("memory_plan", []).append(case)
        save()
    errors = [c["worst_error_pct"] for c in cases]
    worst = None if None in errors else max(errors)
    if worst is None:
        raise RuntimeError("memory plan: a device had no logged buffers or no measurement (see memory_plan in gpu-check.json)")
    return {"cases": len(cases), "worst_error_pct": worst, "within_10_pct": worst <= 10.0}


NVFP4_PRESETS = ("tiny-glm-dsa",)


@step("nvfp4")
def nvfp4(models: Path) -> dict:
    """The nvfp4-mix synth type (NVFP4 routed experts with per-expert scale_2, Q8_0 elsewhere) on the GPU: temperature-0
    tokens and teacher-forced logits NMSE GPU vs CPU (server and in-process), then the serving soak at the default
    --parallel and at 16, and the NMSE per prompt length. Pass: as the other types (tokens equal or NMSE <= 1e-4;
    soak 0 crashes, 0 HTTP errors)."""
    from pyllm_a100.synth import synthesize

    out = []
    for preset in NVFP4_PRESETS:
        model = models / f"{preset}-nvfp4-mix.gguf"
        if not model.exists():
            synthesize(preset, model, weight_type="nvfp4-mix", seed=42)
        prompt = [0, 271, 289, 300, 500, 700, 900]
        result = {"preset": preset, "type": "nvfp4-mix", **compare(model, models, prompt)}
        for parallel in (None, 16):
            soak_case(model, preset, "nvfp4-mix", parallel)
        SERVING["nmse"].append({"preset": preset, "type": "nvfp4-mix", **length_nmse(model, NMSE_LENGTHS)})
        save_serving()
        RESULTS.setdefault("nvfp4", []).append(result)
        out.append(result)
        save()
    cases = [c for c in SERVING["cases"] if c["type"] == "nvfp4-mix"]
    crashes = sum(c.get("crashes", 0) for c in cases) + sum(c.get("http_errors", 0) for c in cases)
    failed = [r["preset"] for r in out if not (r["pass_server"] and r["pass_in_process"])]
    if failed or crashes or any("error" in c for c in cases):
        raise RuntimeError(f"nvfp4-mix: compare failed for {failed or 'none'}, {crashes} crash(es)/HTTP error(s) in the soak")
    return {"presets": [r["preset"] for r in out], "soak_requests": sum(c.get("requests", 0) for c in cases)}
