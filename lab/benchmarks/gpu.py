"""GPU benchmarks on the device machine: ratios and fractions measured side by side in one run.

    python -m lab.benchmarks.gpu --out DIR [--phases hbm,tune,rpc,scale] [--v4-layers 4] [--scale-experts 16]

Needs the package built with CUDA and importable (python -m lab.runs.gpu_check installs it into
/tmp/pyllm-site; this program runs itself again with that folder leading PYTHONPATH). Each phase is recorded in
DIR/gpu-bench.json as it finishes; python -m lab.benchmarks.report turns that file (copied to
lab/benchmarks/results/gpu.json) into lab/notes/benchmarks.md.

  hbm    real-shape deepseek-v4-flash cut to --v4-layers, one GPU, pyllm serve's defaults:
         decode tokens/s against the HBM ceiling (active weight bytes per token / bandwidth);
  tune   the same model on every GPU: pyllm tune's sweep, then seed-style flags
         (-ngl 999 --split-mode layer --tensor-split 1,1) against the winner, interleaved;
  rpc    two rpc-workers (one per GPU) behind pyllm serve --rpc against a direct --tensor-split 1x2;
  scale  all 43 layers with --scale-experts routed experts per layer (the same weight bytes per
         token as the full model): load time, memory per GPU and speed on one GPU and on two.

Serving figures (issue 17; write them to their own file: --results gpu-serving-bench.json):
  concurrency  the real-shape model on two GPUs (--tensor-split 1x2): --concurrency-levels streams
               at pyllm serve's default --parallel and at each --tuned-parallel value, one server each;
  verify       llama-bench: one forward of k = 1..16 tokens at depth --depth vs one decode step,
               on one GPU and on two;
  speculative  the same prompts without and with the synthetic DSpark draft
               (deepseek-v4-flash-dspark, same layers and seed): acceptance, overhead per step;
               skipped with a note when this build of the package has no such preset.
--cpu runs these three on this machine with tiny presets (tiny-deepseek4; the draft run uses
tiny-deepseek4-dspark when it exists, else tiny-llama drafting for itself with draft-simple),
so a typo cannot cost a GPU run: python -m lab.benchmarks.gpu --cpu --out /tmp/cpu-serving.
--dispatch a100 (issue 41) runs the whole script again with lab/scripts/a100-dispatch.c in LD_PRELOAD (an A100's host
dispatch for every server and tool); the results file records the dispatch and the compute capabilities logged.
"""


from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PHASES = ("hbm", "tune", "rpc", "scale", "concurrency", "verify", "speculative")  # lab.bench.gpu_phases's


def main() -> int:
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
    parser.add_argument("--results", default=None, help="file name under --out (default gpu-bench.json; "
                        "cpu-serving-bench.json with --cpu)")
    parser.add_argument("--cpu", action="store_true", help="the serving phases on this machine with tiny presets")
    parser.add_argument("--concurrency-levels", default="1,4,8,16,32")
    parser.add_argument("--tuned-parallel", default="16,32,16u", help="--parallel values measured beside the default "
                        "(Nu: N slots sharing one KV pool, --kv-unified)")
    parser.add_argument("--serving-prompt", type=int, default=None, help="prompt tokens (default 256; 128 with --cpu)")
    parser.add_argument("--serving-gen", type=int, default=None, help="generated tokens (default 64; 32 with --cpu)")
    parser.add_argument("--serving-repeat", type=int, default=2, help="requests per stream (concurrency), requests (speculative)")
    parser.add_argument("--spec-gen", type=int, default=128)
    parser.add_argument("--verify-k", default="1-16")
    parser.add_argument("--verify-repeat", type=int, default=5)
    parser.add_argument("--depth", type=int, default=512, help="context depth of the verify-cost forwards")
    from lab.bench import dispatch as dsp
    from lab.bench import stages

    dsp.add_arguments(parser)
    args = parser.parse_args()
    dispatcher = dsp.from_args(args, build_dir=args.out)
    try:  # the same process again with the dispatch's LD_PRELOAD: every server and tool it starts inherits it
        dsp.reexec_with(args.dispatch, dispatcher.shim if args.dispatch == "a100" else None, stages.own_argv())
    except dsp.DispatchError as exc:
        parser.error(str(exc))
    results_name = args.results or ("cpu-serving-bench.json" if args.cpu else "gpu-bench.json")
    if args.cpu and args.phases == parser.get_default("phases"):
        args.phases = "concurrency,verify,speculative"
    args.serving_prompt = args.serving_prompt or (128 if args.cpu else 256)
    args.serving_gen = args.serving_gen or (32 if args.cpu else 64)
    phases = args.phases.split(",")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"--phases: unknown {', '.join(unknown)}; choose from {','.join(PHASES)}")
    stages.reexec_with_pythonpath(str(args.site))  # the package from the site gpu_check installed (else this checkout's)
    from lab.bench import gpu_phases
    from lab.bench.gpu_phases import (RESULTS, concurrency, hbm, measured_bandwidth, rpc, save, scale, speculative,
                                             tune, verify)

    assert gpu_phases.PHASES == PHASES, gpu_phases.PHASES
    gpu_phases.start(args.out, results_name)
    for d in (gpu_phases.OUT, gpu_phases.LOGS, args.models):
        d.mkdir(parents=True, exist_ok=True)
    earlier = gpu_phases.OUT / results_name
    if earlier.exists():  # phases run by an earlier command into the same file stay (one command per phase fits the time limit)
        kept = json.loads(earlier.read_text())
        RESULTS["phases"].update(kept.get("phases", {}))
        RESULTS["models"] = kept.get("models", {})
    os.environ.setdefault("CUDA_CACHE_MAXSIZE", "4294967296")
    os.environ.setdefault("PYLLM_HOME", "/tmp/pyllm-home")
    from pyllm_a100 import build_info
    from pyllm_a100.devices.gpus import visible_gpus

    RESULTS["build"] = build_info()
    RESULTS["gpus"] = [{"name": g.name, "compute_capability": g.compute_capability, "memory_total": g.memory_total,
                        "memory_bandwidth": g.memory_bandwidth} for g in visible_gpus()]
    RESULTS["bandwidth_measured"] = measured_bandwidth() if RESULTS["gpus"] else None
    RESULTS["settings"] = {k: v for k, v in vars(args).items() if k not in ("out", "site", "models")}
    RESULTS["machine"] = {"cpus": os.cpu_count(), "arch": os.uname().machine}
    save()
    if "hbm" in phases:
        hbm(args.models, args.v4_layers, args)
    if "tune" in phases:
        tune(args.models, args.v4_layers, args)
    if "rpc" in phases:
        rpc(args.models, args.v4_layers, args)
    if "scale" in phases:
        scale(args.models, args)
    if "concurrency" in phases:
        concurrency(args.models, args)
    if "verify" in phases:
        verify(args.models, args)
    if "speculative" in phases:
        speculative(args.models, args)
    RESULTS["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    caps = sorted({c for f in sorted(gpu_phases.LOGS.rglob("*.log")) for c in [dsp.reported_capability(f.read_text(errors="replace"))] if c})
    RESULTS["dispatch"] = dispatcher.describe() | {"dispatch": dsp.current()}
    RESULTS["reported_capability"] = caps[0] if len(caps) == 1 else (caps or None)
    save()
    failed = [n for n, p in RESULTS["phases"].items() if not p["ok"]]
    print("failed phases:", failed or "none")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
