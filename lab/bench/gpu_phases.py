"""lab/benchmarks/gpu.py's phases on the device machine: hbm, tune, rpc, scale (lab/notes/benchmarks.md's GPU section) and the
serving figures concurrency, verify, speculative; each recorded in OUT/RESULTS_NAME as it finishes."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

RESULTS: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "phases": {}}
SEED_FLAGS = dict(n_gpu_layers=999, split_mode="layer", tensor_split="1,1")  # what the field runs, on two GPUs
OUT: Path
LOGS: Path


RESULTS_NAME = "gpu-bench.json"


def start(out: Path, results_name: str) -> None:
    """Where the results file (OUT/RESULTS_NAME) and the server logs (OUT/bench-logs) go (lab/benchmarks/gpu.py --out)."""
    global OUT, LOGS, RESULTS_NAME
    OUT, LOGS, RESULTS_NAME = out, out / "bench-logs", results_name


def save() -> None:
    tmp = OUT / (RESULTS_NAME + ".tmp")
    tmp.write_text(json.dumps(RESULTS, indent=2, default=str))
    tmp.replace(OUT / RESULTS_NAME)


def gpu_memory_mib() -> list[int]:
    """Memory in use on every GPU of the machine (NVML), MiB."""
    from pyllm_a100.devices.gpus import visible_gpus

    return [(g.memory_total - g.memory_free) >> 20 for g in visible_gpus()]


BANDWIDTH = r"""
import torch
n = 4 << 30
src = torch.empty(n, dtype=torch.uint8, device="cuda:0")
dst = torch.empty_like(src)
dst.copy_(src)
torch.cuda.synchronize()
best = 0.0
for _ in range(5):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    best = max(best, 2 * n * 10 / (start.elapsed_time(end) / 1000))
print(best)
"""


def measured_bandwidth() -> float | None:
    """Device-to-device copies of 4 GiB with torch (read + write counted), bytes/s, in a process of its
    own (its CUDA context must not stay on the GPU); None without torch."""
    out = subprocess.run([sys.executable, "-c", BANDWIDTH], capture_output=True, text=True, timeout=300)
    return float(out.stdout.split()[-1]) if out.returncode == 0 and out.stdout.strip() else None


def serve_and_bench(label: str, model: Path, *, prompt: int, gen: int, repeat: int, env: dict | None = None,
                    **options) -> dict:
    """One managed server: time to ready, memory per GPU once ready, then bench.run."""
    from pyllm_a100.serve.server import Server
    from pyllm_a100.bench import throughput as bench

    started = time.monotonic()
    with Server(model, port=0, ctx_size=options.pop("ctx_size", 4096), ready_timeout=900, env=env,
                log_path=LOGS / f"{label}.log", **options) as srv:
        ready = time.monotonic() - started
        memory = gpu_memory_mib()
        result = bench.run(srv.base_url, prompt_tokens=prompt, gen_tokens=gen, repeat=repeat)
        argv = srv.argv
    row = {"label": label, "ready_s": round(ready, 2), "gpu_memory_mib": memory, "argv": argv[1:],
           "prefill_tps": result.prefill_tps, "decode_tps": result.decode_tps, "ttft_s": result.ttft_s}
    print(f"   {label}: ready {ready:.1f} s, prefill {result.prefill_tps:.0f}, decode {result.decode_tps:.1f} tok/s, "
          f"memory {memory} MiB", flush=True)
    return row


def interleaved(model: Path, args, prefix: str, sides: dict[str, dict]) -> tuple[dict, dict]:
    """Two server configurations measured A B, B A, A B, ... (drifts cancel): every run, and medians per side."""
    first, second = sides
    runs: dict[str, list] = {first: [], second: []}
    for i in range(args.rounds):
        for kind in ((first, second) if i % 2 == 0 else (second, first)):
            runs[kind].append(serve_and_bench(f"{prefix}{kind}-{i}", model, prompt=args.prompt, gen=args.gen,
                                              repeat=args.repeat, **sides[kind]))
    medians = {k: {m: statistics.median(r[m] for r in v) for m in ("decode_tps", "prefill_tps", "ready_s")}
               for k, v in runs.items()}
    return runs, medians


def phase(name: str):
    def wrap(fn):
        def run(*args, **kwargs):
            print(f"== {name}", flush=True)
            started = time.monotonic()
            try:
                RESULTS["phases"][name] = {"ok": True, **fn(*args, **kwargs)}
            except Exception as exc:  # recorded; the next phase still runs
                traceback.print_exc()
                RESULTS["phases"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            RESULTS["phases"][name]["seconds"] = round(time.monotonic() - started, 1)
            save()
        return run
    return wrap


def model_file(models: Path, layers: int, experts: int | None) -> Path:
    """The synthetic real-shape model (seed 42), written once per machine."""
    from pyllm_a100.synth import synthesize

    path = models / f"v4f-{layers}l{'-' + str(experts) + 'e' if experts else ''}.gguf"
    if not path.exists():
        result = synthesize("deepseek-v4-flash", path, layers=layers, experts=experts, seed=42)
        RESULTS.setdefault("models", {})[path.name] = {"bytes": result.bytes_written, "write_s": round(result.seconds, 1)}
    return path


def roofline(path: Path, decode_tps: float, bandwidth: float) -> dict:
    from pyllm_a100.models.gguf_files import resolve_model
    from pyllm_a100.models.roofline import weights_per_token

    w = weights_per_token(resolve_model(path))
    ceiling = w.ceiling_tokens_per_second(bandwidth)
    return {"model_bytes": w.total_bytes, "active_bytes_per_token": w.active_bytes, "experts": w.experts,
            "experts_used": w.experts_used, "ceiling_tps": ceiling, "fraction": decode_tps / ceiling}


@phase("hbm")
def hbm(models: Path, layers: int, args) -> dict:
    from pyllm_a100.devices.gpus import visible_gpus

    model = model_file(models, layers, None)
    row = serve_and_bench("hbm-1gpu", model, prompt=args.prompt, gen=args.gen, repeat=args.repeat,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
    spec = next((g.memory_bandwidth for g in visible_gpus()), None)
    return {"model": model.name, "layers": layers, "run": row,
            "spec": roofline(model, row["decode_tps"], spec) if spec else None,
            "measured": roofline(model, row["decode_tps"], RESULTS["bandwidth_measured"]) if RESULTS.get("bandwidth_measured") else None}


@phase("tune")
def tune(models: Path, layers: int, args) -> dict:
    from pyllm_a100.bench import throughput as bench

    model = model_file(models, layers, None)
    rows = bench.tune(str(model), prompt_tokens=args.prompt, gen_tokens=args.tune_gen, repeat=2,
                      on_row=lambda r: print(f"   {r.candidate.label}: " + (
                          f"decode {r.result.decode_tps:.1f}, prefill {r.result.prefill_tps:.0f}" if r.result else f"failed: {r.error}"),
                          flush=True))
    best = bench.winner(rows)
    cand = best.candidate
    RESULTS["tune_winner"] = {"label": cand.label, "tensor_split": cand.tensor_split, "split_mode": cand.split_mode,
                              "extra_args": cand.extra_args}
    sweep = [{"label": r.candidate.label, "decode_tps": r.result.decode_tps if r.result else None,
              "prefill_tps": r.result.prefill_tps if r.result else None, "error": r.error} for r in rows]
    side, med = interleaved(model, args, "tune-", {
        "seed": dict(SEED_FLAGS),
        "winner": dict(tensor_split=cand.tensor_split, split_mode=cand.split_mode, extra_args=cand.extra_args)})
    return {"model": model.name, "sweep": sweep, "winner": RESULTS["tune_winner"],
            "winner_command": bench.serve_command(model.name, cand), "seed_flags": "-ngl 999 --split-mode layer --tensor-split 1,1",
            "runs": side, "median": med,
            "decode_ratio": med["winner"]["decode_tps"] / med["seed"]["decode_tps"],
            "prefill_ratio": med["winner"]["prefill_tps"] / med["seed"]["prefill_tps"]}


@phase("rpc")
def rpc(models: Path, layers: int, args) -> dict:
    from pyllm_a100.serve.net import free_port
    from pyllm_a100.serve.rpc import RpcWorker, WorkerConfig

    model = model_file(models, layers, None)
    workers = [RpcWorker(WorkerConfig(port=free_port(), devices=f"CUDA{i}"), log_path=LOGS / f"rpc-worker-{i}.log",
                         ready_timeout=120) for i in range(2)]
    for w in workers:
        w.start()
    try:
        endpoints = [w.config.endpoint for w in workers]
        hidden = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # llama-server itself sees no GPU: only the workers'
        side, med = interleaved(model, args, "", {"rpc": dict(env=hidden, rpc=endpoints), "direct": dict(tensor_split="1x2")})
    finally:
        for w in workers:
            w.stop()
    return {"model": model.name, "runs": side, "median": med,
            "decode_ratio": med["rpc"]["decode_tps"] / med["direct"]["decode_tps"],
            "prefill_ratio": med["rpc"]["prefill_tps"] / med["direct"]["prefill_tps"]}


@phase("scale")
def scale(models: Path, args) -> dict:
    from pyllm_a100.devices.gpus import visible_gpus

    free = shutil.disk_usage(models).free
    model = model_file(models, args.scale_layers, args.scale_experts)
    winner = RESULTS.get("tune_winner") or {}
    runs = {}
    for label, opts in [("1 GPU", dict(env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))),
                        ("2 GPUs, seed flags", dict(SEED_FLAGS)),
                        ("2 GPUs, tune's winner flags", dict(extra_args=winner.get("extra_args") or [],
                                                             split_mode=winner.get("split_mode"), tensor_split="1x2"))]:
        if label.endswith("winner flags") and not (winner.get("extra_args") or winner.get("split_mode")):
            continue  # the winner changed only the GPU count: the two rows above already are that comparison
        runs[label] = serve_and_bench("scale-" + label.replace(" ", "-").replace(",", "").replace("'", ""), model,
                                      prompt=args.prompt, gen=args.gen, repeat=args.repeat, **opts)
    spec = next((g.memory_bandwidth for g in visible_gpus()), None)
    for row in runs.values():
        row["spec"] = roofline(model, row["decode_tps"], spec) if spec else None
    return {"model": model.name, "experts": args.scale_experts, "disk_free_before_gb": free / 1e9, "runs": runs,
            "two_over_one_decode": runs["2 GPUs, seed flags"]["decode_tps"] / runs["1 GPU"]["decode_tps"]}


def preset_file(models: Path, preset: str, layers: int | None) -> Path:
    """A synthetic model of any preset (seed 42), written once per machine."""
    from pyllm_a100.synth import synthesize

    path = models / f"{preset}{'-' + str(layers) + 'l' if layers else ''}.gguf"
    if not path.exists():
        result = synthesize(preset, path, layers=layers, seed=42)
        RESULTS.setdefault("models", {})[path.name] = {"bytes": result.bytes_written, "write_s": round(result.seconds, 1)}
    return path


def serving_target(models: Path, args) -> Path:
    return preset_file(models, "tiny-deepseek4", None) if args.cpu else model_file(models, args.v4_layers, None)


def two_gpus(args) -> dict:
    """Server options: both GPUs, or on the CPU one thread (llama.cpp's threads spin at barriers, and this
    machine's cores are shared: two threads slow down many times over when another process takes a core)."""
    return {"extra_args": ["--threads", "1"]} if args.cpu else {"tensor_split": "1x2"}


@phase("concurrency")
def concurrency(models: Path, args) -> dict:
    from pyllm_a100.bench import concurrency as bc

    model = serving_target(models, args)
    levels = bc.parse_levels(args.concurrency_levels)
    parallels = [bc.Slots(), *bc.parse_parallel(args.tuned_parallel)]
    servers: dict[str, list[str]] = {}
    rows = bc.serve_and_measure(
        model, levels, parallels, prompt_tokens=args.serving_prompt, gen_tokens=args.serving_gen,
        requests_per_stream=args.serving_repeat, ready_timeout=900, **two_gpus(args),
        on_server=servers.__setitem__,
        on_level=lambda r: print(f"   --parallel {r.slots}, {r.concurrency} streams: {r.aggregate_tps:.1f} tok/s "
                                 f"aggregate, {r.per_stream_tps:.1f} per stream, TTFT p50 {r.ttft_p50_s:.3f} s "
                                 f"p99 {r.ttft_p99_s:.3f} s, {r.failures} failures", flush=True))
    ratios = bc.scaling(rows)
    return {"model": model.name, "gpus": 0 if args.cpu else 2, "prompt": args.serving_prompt, "gen": args.serving_gen,
            "requests_per_stream": args.serving_repeat, "servers": servers,
            "levels": [dict(r.as_row(), scaling=ratios[(r.slots, r.concurrency)]) for r in rows]}


@phase("verify")
def verify(models: Path, args) -> dict:
    from pyllm_a100.bench import draft_costs as bs

    model = serving_target(models, args)
    ks = bs.parse_k_range(args.verify_k)
    sides = {"CPU, 1 thread": {"extra_args": ["-t", "1"]}} if args.cpu else {"1 GPU": {"env": dict(os.environ, CUDA_VISIBLE_DEVICES="0")},
                                           "2 GPUs": {"tensor_split": "1x2"}}
    out = {}
    for label, opts in sides.items():
        cost = bs.verify_cost(model, ks, depth=args.depth, repetitions=args.verify_repeat, **opts)
        print(f"   {label}: decode step {cost.decode_ms:.3f} ms; " + ", ".join(f"k={r['k']} {r['ratio']:.2f}x" for r in cost.rows),
              flush=True)
        out[label] = cost.as_row()
    return {"model": model.name, "depth": args.depth, "runs": out}


PHASES = ("hbm", "tune", "rpc", "scale", "concurrency", "verify", "speculative")
DRAFT_N_MAX = 7


@phase("speculative")
def speculative(models: Path, args) -> dict:
    from pyllm_a100.synth import PRESETS
    from pyllm_a100.bench import draft_costs as bs

    target_preset = "tiny-deepseek4" if args.cpu else "deepseek-v4-flash"
    draft_preset = f"{target_preset}-dspark"
    layers = None if args.cpu else args.v4_layers
    if draft_preset in PRESETS:
        model = serving_target(models, args)
        draft = preset_file(models, draft_preset, layers)
        draft_args = ["-md", str(draft), "--spec-type", "draft-dspark", "--spec-draft-n-max", str(DRAFT_N_MAX), "-ngld", "all"]
        kind = f"synthetic DSpark draft `{draft_preset}` (random weights)"
    elif args.cpu:
        model = preset_file(models, "tiny-llama", None)
        draft_args = ["-md", str(model), "--spec-type", "draft-simple", "--spec-draft-n-max", str(DRAFT_N_MAX)]
        kind = "`tiny-llama` drafting for itself (draft-simple): the plumbing check, not a real draft"
    else:
        return {"skipped": f"this package has no {draft_preset} preset yet (pyllm synth); merge the draft presets and rerun this phase"}
    run = bs.draft_run(model, draft_args, prompt_tokens=args.serving_prompt, gen_tokens=args.spec_gen,
                       requests=args.serving_repeat, log_dir=LOGS, ready_timeout=900, **two_gpus(args))
    print(f"   acceptance {run.acceptance:.3f} ({run.accepted}/{run.drafted}), step {run.plain_step_ms:.3f} -> "
          f"{run.draft_step_ms:.3f} ms, same tokens: {run.same_tokens} (first differences {run.first_difference})", flush=True)
    return {"model": model.name, "draft": kind, "draft_n_max": DRAFT_N_MAX, "gpus": 0 if args.cpu else 2,
            "prompt": args.serving_prompt, "gen": args.spec_gen, "run": run.as_row()}
