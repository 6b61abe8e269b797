"""Activation scale of synthetic models on the CPU, next to llama.cpp's own random test models.

    python -m lab.runs.activation_rms --build /tmp/archs --baseline REV    # builds test-llama-archs first (CPU, scratch dir)
    python -m lab.runs.activation_rms --archs-bin /tmp/archs/bin/test-llama-archs
    python -m lab.runs.activation_rms --gpu                                # on a GPU machine: GPU vs CPU instead of the KV proxy

For llama, deepseek4, glm-dsa and deepseek32 it writes llama.cpp's random test model
(`test-llama-archs -a ARCH -s SEED -o DIR`, every tensor N(0, 0.1); skipped without
--archs-bin/--build) and synthesizes the matching tiny preset (`pyllm synth PRESET --seed
SEED`; with --baseline also as synth.py of git revision REV wrote it), runs them through the
installed pyllm-a100 build on the same token ids (teacher forcing, one batch) and reads the
activations with an eval callback (llama-cpp-python's ``cb_eval``). Printed, as markdown
(lab/notes/gpu-state.md quotes it):

1. per model: the embedding rows' RMS, the residual stream's RMS after each layer
   (``l_out``; DeepSeek-V4: the hyper-connection state ``l_last``) and how much each layer
   changed it, the K rows entering the cache, the routers' logit spread and margin (score of
   the last expert chosen minus the best one left out), the logits' spread;
2. gpu-check's comparison with an F32-KV CPU run in the GPU's place (the GPU's drift was
   F16-KV rounding flipping a near-tied expert choice): teacher-forced logits NMSE, expert
   choices that differ, how far the routers' scores move, over several seeds. Flash
   attention is off, as in gpu-check's in-process comparison: with it on, llama.cpp casts an
   F32 K/V to F16 before the attention (build_attn_mha), so ``-ctk f32`` changes nothing.
"""


from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from lab.bench.native_view import use_installed_build
from lab.gpucheck.activations import GPU_CHECK_PROMPT, PAIRS, Synth, build, fmt, kv_proxy, probe, test_model

REPO = Path(__file__).resolve().parents[2]
__all__ = ["probe"]  # tests/test_synth.py imports this module and calls probe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--archs-bin", type=Path, help="a built test-llama-archs (without it or --build: no test-model rows)")
    where.add_argument("--build", type=Path, metavar="DIR", help="build test-llama-archs into DIR first")
    parser.add_argument("--baseline", metavar="REV", help="also measure the tiny presets as synth.py of git revision REV wrote them")
    parser.add_argument("--seed", type=int, default=42, help="seed of every model (and of the token ids)")
    parser.add_argument("--proxy-seeds", type=int, default=8, help="models per preset in the KV proxy: seeds SEED, SEED+1, ...")
    parser.add_argument("--tokens", type=int, default=64, help="teacher-forced sequence length of the activation table")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "activation-rms")
    parser.add_argument("--gpu", action="store_true", help="compare the GPU (F16 KV) with the CPU instead of F32 with F16 KV "
                        "(a CUDA build on a GPU machine: gpu-check's comparison with expert choices and router margins)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    use_installed_build()  # the checkout's source tree (python -m from the root) on the installed package's build
    archs_bin = args.archs_bin or (build(args.build, REPO) if args.build else None)
    import numpy as np

    from pyllm_a100.synth import PRESETS

    args.work.mkdir(parents=True, exist_ok=True)
    synths = ([Synth(args.baseline, args.work, REPO)] if args.baseline else []) + [Synth(None, args.work, REPO)]
    # ids every vocabulary has (the test models have 128 tokens), the same for all models
    tokens = [int(t) for t in np.random.default_rng(args.seed).integers(1, 128, args.tokens)]
    record: dict = {"activations": {}, "kv_proxy": []}
    for arch, stem, preset in PAIRS:
        n_used = PRESETS[preset].hparams.get("n_expert_used", 2)
        models = {"test-llama-archs": (test_model(archs_bin, arch, stem, args.seed, args.work), 2)} if archs_bin else {}
        models.update({synth.label.format(preset): (synth.model(preset, args.seed), n_used) for synth in synths})
        for label, (path, used) in models.items():
            record["activations"][f"{arch} {label}"] = probe(path, tokens, used, True, args.work)
    print(f"CPU, F32 KV cache, {args.tokens} teacher-forced token ids (seed {args.seed}); residual = the residual stream "
          f"(DeepSeek-V4: the hyper-connection state), change = RMS(after - before) / RMS(before) per layer.\n")
    print("| arch | model | embedding RMS | residual RMS after each layer | change per layer | K rows RMS | "
          "router logit std | router margin min / median | logits std |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, result in record["activations"].items():
        arch, label = key.split(" ", 1)
        layers = result["layers"]
        ks = [r["k"] for r in layers if "k" in r]
        routers = [r["router_std"] for r in layers if "router_std" in r]
        margins = [r for r in layers if "margin_min" in r]
        margin = (f"{min(r['margin_min'] for r in margins):.2g} / {float(np.median([r['margin_median'] for r in margins])):.2g}"
                  if margins else "no choice")
        print(f"| {arch} | {label} | {fmt(result['embedding_rms'])} | {' / '.join(fmt(r['resid']) for r in layers)} | "
              f"{' / '.join(fmt(r['change']) for r in layers)} | {fmt(float(np.mean(ks))) if ks else ''} | "
              f"{fmt(float(np.mean(routers))) if routers else ''} | {margin} | {fmt(result['logits_std'])} |")
    if args.proxy_seeds > 0:
        sides = "GPU vs CPU, both F16 KV" if args.gpu else "F16 vs F32 KV cache on the CPU"
        print(f"\n{sides}, gpu-check's procedure (prompt {GPU_CHECK_PROMPT} + 16 greedy tokens, "
              f"teacher-forced logits, flash attention off), models of seeds {args.seed}..{args.seed + args.proxy_seeds - 1}; "
              f"score error = RMS change of the routers' selection scores.\n")
        print("| preset | logits NMSE median | max | models over 1e-4 | expert choices that differ | score error | "
              "smallest router margin | seed " + str(args.seed) + ": NMSE, smallest margin |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for preset in (p for _, _, p in PAIRS):
            for synth in synths:
                runs = [kv_proxy(synth, preset, seed, args.gpu) for seed in range(args.seed, args.seed + args.proxy_seeds)]
                record["kv_proxy"] += runs
                e = [r["nmse"] for r in runs]
                errors = [r["score_error"] for r in runs if r["score_error"] is not None]
                margins = [r["router_margin_min"] for r in runs if r["router_margin_min"] is not None]
                first = runs[0]
                print(f"| {synth.label.format(preset)} | {np.median(e):.1e} | {max(e):.1e} | {sum(x > 1e-4 for x in e)} / {len(e)} | "
                      f"{sum(r['flips'] for r in runs)} / {sum(r['decisions'] for r in runs)} | "
                      f"{fmt(float(np.median(errors))) if errors else ''} | {fmt(min(margins)) if margins else ''} | "
                      f"{first['nmse']:.1e}, {fmt(first['router_margin_min'])} |")
    if args.json:
        args.json.write_text(json.dumps(record, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
