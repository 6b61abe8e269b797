"""What one step costs by its prompt tokens and depth (issue 61 item 1), on the package's build, per dispatch column
and per probe setting (environment switches of a lab probe patch, e.g. lab/patches/cuda-small-batch-matmul-policy-probe).

    python -m lab.runs.gpu_steps [--work /tmp/dec] [--site /tmp/pkg] [--columns pyllm@a100] [--models v4-43l]
        [--prompts 16,64,128,512] [--depths 0,16384,32768,65536] [--reps 2] [--probe NAME='VAR=V ...']... steps|report

Per model, column and probe (``default``: no switch): the package's llama-bench, flash attention on, every layer on
the GPU, -ub 512: one prompt step of each --prompts size at each --depths (``-p P -n 0 -d D``: one llama_decode of P
tokens after D tokens; llama-bench fills each depth once and restores it for the next test), then decode (``-p 0
-n 16 -d D``: 16 one-token steps). Each depth's prompt steps are fitted as fixed + per_token x tokens (least squares);
``target_64`` is issue 61's bound for a 64-token step: 1.3 x (64 x the 512-token step's per-token cost + one decode
step). WORK/results/gpu-steps.json is written after every row, with the exact command lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

from lab.bench import dispatch as dsp
from lab.bench import lab_models, served

D = dsp.Dispatcher()
RESULT = "gpu-steps.json"
DECODE_TOKENS = 16


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed ms, ms per token) of ms = fixed + per_token x tokens, least squares."""
    n = len(points)
    sx = sum(p for p, _ in points)
    sy = sum(ms for _, ms in points)
    sxx = sum(p * p for p, _ in points)
    sxy = sum(p * ms for p, ms in points)
    per = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - per * sx) / n, per


def bench(binary: str, model: str, args: list[str], env: dict[str, str]) -> tuple[list[dict], list[str]]:
    argv = [binary, "-m", model, "-ngl", "999", "-fa", "1", "-ub", "512", "-o", "json", *args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3000)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({out.returncode}): {out.stderr[-800:]}")
    return json.loads(out.stdout), argv


def row_for(a, model: str, col: str, disp: str, probe: str, probe_env: dict[str, str]) -> dict:
    env = dict(served.child_env(D, disp), **probe_env)
    binary = str(served.native() / "llama-bench")
    path = lab_models.path(a.work, model)
    depths = ",".join(map(str, a.depths))
    prompt, argv_p = bench(binary, path, ["-p", ",".join(map(str, a.prompts)), "-n", "0", "-d", depths, "-r", str(a.reps)], env)
    decode, argv_n = bench(binary, path, ["-p", "0", "-n", str(DECODE_TOKENS), "-d", depths, "-r", str(a.reps)], env)
    steps: dict[int, dict[int, float]] = {}
    for t in prompt:
        steps.setdefault(int(t["n_depth"]), {})[int(t["n_prompt"])] = t["avg_ns"] / 1e6
    per_depth = []
    for t in decode:
        d = int(t["n_depth"])
        dec = t["avg_ns"] / 1e6 / DECODE_TOKENS
        points = sorted(steps.get(d, {}).items())
        fixed, per_token = fit(points) if len(points) >= 2 else (None, None)
        at = dict(points)
        target = 1.3 * (64 * at[512] / 512 + dec) if 512 in at else None
        per_depth.append({"depth": d, "decode_ms": round(dec, 3), "prompt_step_ms": {str(p): round(ms, 3) for p, ms in points},
                          "fixed_ms": None if fixed is None else round(fixed, 2),
                          "per_token_ms": None if per_token is None else round(per_token, 4),
                          "step_64_ms": round(at[64], 2) if 64 in at else None,
                          "target_64_ms": None if target is None else round(target, 2),
                          "step_64_within_target": (at[64] <= target) if target is not None and 64 in at else None})
    return {"kind": "steps", "model": model, "layers": lab_models.layers(path), "column": col, "dispatch": disp,
            "probe": probe, "probe_env": probe_env, "alone": True, "reps": a.reps, "depths": per_depth,
            "commands": [shlex.join(argv_p), shlex.join(argv_n)],
            **{k: v for k, v in dsp.probe(served.native(), env).items() if k != "text"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", choices=["steps", "report"])
    served.add_arguments(ap, columns="pyllm@a100")
    ap.add_argument("--models", default="v4-43l")
    ap.add_argument("--prompts", default="16,64,128,512", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--depths", default="0,16384,32768,65536", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--probe", action="append", default=[], help="NAME='VAR=V VAR2=V2': a setting of environment "
                    "switches (the probe patch's), measured after the default")
    ap.add_argument("--no-default", action="store_true", help="measure only the --probe settings (a smaller grid "
                    "beside a default row taken before)")
    a = ap.parse_args()
    a.command = shlex.join([sys.executable, "-m", "lab.runs.gpu_steps", *sys.argv[1:]])
    served.prepare(a)
    global D
    D = dsp.from_args(a)
    probes = ([] if a.no_default else [("default", {})]) + [(n, dict(kv.split("=", 1) for kv in shlex.split(v)))
                                  for n, v in (p.split("=", 1) for p in a.probe)]
    results = lab_models.Results(os.path.join(a.work, "results", RESULT), ("kind", "model", "column", "probe"),
                                 {"generated_by": "python -m lab.runs.gpu_steps", "command": a.command}, None)
    if "steps" not in a.stages:
        for row in results.rows:
            for d in row.get("depths", []):
                print(f"{row['model']} {row['column']} {row['probe']} d{d['depth']}: {d['prompt_step_ms']} decode "
                      f"{d['decode_ms']} fixed {d['fixed_ms']} + {d['per_token_ms']}/token")
        return 0
    for model in lab_models.check(a.models.split(",")):
        for col, disp in served.columns(a.columns, "native"):
            for name, env in probes:
                print(f"== {model} {col} {name}", flush=True)
                try:
                    row = row_for(a, model, col, disp, name, env)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    row = {"kind": "steps", "model": model, "column": col, "dispatch": disp, "probe": name,
                           "error": str(exc)[-600:]}
                results.put(row)
                results.save()
                for d in row.get("depths", []):
                    print(f"  d{d['depth']:>6}: decode {d['decode_ms']} ms, steps {d['prompt_step_ms']}, fixed "
                          f"{d['fixed_ms']} + {d['per_token_ms']}/token; 64: {d['step_64_ms']} vs target {d['target_64_ms']}",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
