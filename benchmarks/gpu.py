#!/usr/bin/env python3
"""GPU benchmarks on the device machine: ratios and fractions measured side by side in one run.

    python3 benchmarks/gpu.py --out DIR [--phases hbm,tune,rpc,scale] [--v4-layers 4] [--scale-experts 16]

Needs the package built with CUDA and importable (scripts/gpu-check installs it into
/tmp/pyllm-site; this script puts that folder on sys.path). Each phase is recorded in
DIR/gpu-bench.json as it finishes; benchmarks/report.py turns that file (copied to
benchmarks/results/gpu.json) into docs/benchmarks.md.

  hbm    real-shape deepseek-v4-flash cut to --v4-layers, one GPU, pyllm serve's defaults:
         decode tokens/s against the HBM ceiling (active weight bytes per token / bandwidth);
  tune   the same model on every GPU: pyllm tune's sweep, then seed-style flags
         (-ngl 999 --split-mode layer --tensor-split 1,1) against the winner, interleaved;
  rpc    two rpc-workers (one per GPU) behind pyllm serve --rpc against a direct --tensor-split 1x2;
  scale  all 43 layers with --scale-experts routed experts per layer (the same weight bytes per
         token as the full model): load time, memory per GPU and speed on one GPU and on two.
"""

from __future__ import annotations

import argparse
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


def save() -> None:
    (OUT / "gpu-bench.json").write_text(json.dumps(RESULTS, indent=2, default=str))


def gpu_memory_mib() -> list[int]:
    """Memory in use on every GPU of the machine (NVML), MiB."""
    from pyllm_a100.gpus import visible_gpus

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
    from pyllm_a100 import Server, bench

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
    from pyllm_a100.gguf_files import resolve_model
    from pyllm_a100.roofline import weights_per_token

    w = weights_per_token(resolve_model(path))
    ceiling = w.ceiling_tokens_per_second(bandwidth)
    return {"model_bytes": w.total_bytes, "active_bytes_per_token": w.active_bytes, "experts": w.experts,
            "experts_used": w.experts_used, "ceiling_tps": ceiling, "fraction": decode_tps / ceiling}


@phase("hbm")
def hbm(models: Path, layers: int, args) -> dict:
    from pyllm_a100.gpus import visible_gpus

    model = model_file(models, layers, None)
    row = serve_and_bench("hbm-1gpu", model, prompt=args.prompt, gen=args.gen, repeat=args.repeat,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
    spec = next((g.memory_bandwidth for g in visible_gpus()), None)
    return {"model": model.name, "layers": layers, "run": row,
            "spec": roofline(model, row["decode_tps"], spec) if spec else None,
            "measured": roofline(model, row["decode_tps"], RESULTS["bandwidth_measured"]) if RESULTS.get("bandwidth_measured") else None}


@phase("tune")
def tune(models: Path, layers: int, args) -> dict:
    from pyllm_a100 import bench

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
    from pyllm_a100.net import free_port
    from pyllm_a100.rpc import RpcWorker, WorkerConfig

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
    from pyllm_a100.gpus import visible_gpus

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


def main() -> int:
    global OUT, LOGS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--site", type=Path, default=Path("/tmp/pyllm-site"))
    parser.add_argument("--models", type=Path, default=Path("/tmp/pyllm-models"))
    parser.add_argument("--phases", default="hbm,tune,rpc,scale")
    parser.add_argument("--v4-layers", type=int, default=4)
    parser.add_argument("--scale-layers", type=int, default=43)
    parser.add_argument("--scale-experts", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--tune-gen", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds for the side-by-side comparisons")
    args = parser.parse_args()
    OUT, LOGS = args.out, args.out / "bench-logs"
    for d in (OUT, LOGS, args.models):
        d.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(args.site))
    os.environ.setdefault("CUDA_CACHE_MAXSIZE", "4294967296")
    os.environ.setdefault("PYLLM_HOME", "/tmp/pyllm-home")
    from pyllm_a100 import build_info
    from pyllm_a100.gpus import visible_gpus

    RESULTS["build"] = build_info()
    RESULTS["gpus"] = [{"name": g.name, "compute_capability": g.compute_capability, "memory_total": g.memory_total,
                        "memory_bandwidth": g.memory_bandwidth} for g in visible_gpus()]
    RESULTS["bandwidth_measured"] = measured_bandwidth() if RESULTS["gpus"] else None
    RESULTS["settings"] = {k: v for k, v in vars(args).items() if k not in ("out", "site", "models")}
    save()
    phases = args.phases.split(",")
    if "hbm" in phases:
        hbm(args.models, args.v4_layers, args)
    if "tune" in phases:
        tune(args.models, args.v4_layers, args)
    if "rpc" in phases:
        rpc(args.models, args.v4_layers, args)
    if "scale" in phases:
        scale(args.models, args)
    RESULTS["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    save()
    failed = [n for n, p in RESULTS["phases"].items() if not p["ok"]]
    print("failed phases:", failed or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
