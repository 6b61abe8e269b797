"""KL divergence GPU vs CPU on a real model, as llama.cpp measures it (lab/gpucheck/kld.py).

    python -m lab.runs.gpu_kld --bin DIR --model MODEL.gguf --out OUT [--work TMP] [--threads A,B] [--cpu-only]
        [--dispatch native|a100] [--dispatch-shim PATH]
    python -m lab.runs.gpu_kld --gap --bin DIR --model MODEL.gguf --out OUT [--types f32,q8_0,q4_0,q4_1]
        [--dispatches native,a100] [--build LABEL=DIR[@a100]...] [--gpu-variant NAME=ARGS...]

DIR holds llama-perplexity and llama-quantize (this package's _native, or python -m lab.runs.gpu_decode's WORK/patched-bin; they
run with LD_LIBRARY_PATH=DIR). Steps: MODEL -> F32 (llama-quantize), the F32 model's log-probabilities over the
package's corpus on the CPU (the base, in TMP), MODEL against the base on the CPU at two thread counts (all cores and
half) and on the GPU (-ngl 99). Writes OUT/gpu-kld.json (commit it as lab/results/gpu-kld.json: python -m lab.tools.render_compat
then decides the README's llama row by kld.RULE) and OUT/kld-logs/. Exit 0 when the GPU is within the CPU noise (or
--cpu-only), 1 when not, 2 on a bad input or a failed run (one line on stderr). --dispatch a100 runs the GPU side with
lab/scripts/a100-dispatch.c preloaded (an A100's host dispatch); the JSON records it and the capability llama.cpp logged.

--gap (issue 41): the runs that explain the GPU/CPU gap (lab/gpucheck/kld_gap.py): the F32 upcast itself (the GPU's
floor), Q8_0 and Q4_0 made from it by llama-quantize, and the model, each on the CPU and on the GPU under every
--dispatches, plus every --build (e.g. cublas=/tmp/dec/patched-cublas-bin from python -m lab.runs.gpu_build -D
GGML_CUDA_FORCE_CUBLAS=ON) and --gpu-variant (e.g. fa-off='-fa off'); writes OUT/gpu-kld-gap.json and prints its table.
Exit 0 when every run gave a figure, 1 when some did not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


from lab.bench import dispatch as dsp
from lab.gpucheck import kld, kld_gap


def threads(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give two thread counts, e.g. 16,8") from None
    if a < 1 or b < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: thread counts must be >= 1")
    return a, b


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        print(f"error: {message} (python -m lab.runs.gpu_kld --help)", file=sys.stderr)
        sys.exit(2)


def main() -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, type=Path, help="folder with llama-perplexity and llama-quantize")
    parser.add_argument("--model", required=True, type=Path, help="the GGUF to check (SmolLM2-135M-Instruct.Q4_1)")
    parser.add_argument("--out", required=True, type=Path, help="gpu-kld.json and kld-logs/ go here")
    parser.add_argument("--work", type=Path, help="the F32 model and the base file (~600 MB; default: a temp dir)")
    parser.add_argument("--corpus", type=Path, default=kld.CORPUS, help="text to score (default: the package's)")
    parser.add_argument("--ctx", type=int, default=kld.CTX, help="tokens per chunk (llama-perplexity -c)")
    parser.add_argument("--chunks", type=int, help="at most this many chunks (default: the whole corpus)")
    parser.add_argument("--threads", type=threads, help="the two CPU runs' thread counts (default: all cores, half)")
    parser.add_argument("--cpu-only", action="store_true", help="no GPU run (the verdict is then 'no GPU run')")
    parser.add_argument("--self-check", action="store_true", help="also score the F32 model against its own base")
    dsp.add_arguments(parser)
    parser.add_argument("--gap", action="store_true", help="the gap matrix: every --types on CPU and GPU (kld_gap.py)")
    parser.add_argument("--types", default=",".join(kld_gap.TYPES), help="--gap: weight types (default f32,q8_0,q4_0,q4_1)")
    parser.add_argument("--dispatches", default="native,a100", help="--gap: the GPU runs' dispatches (default native,a100)")
    parser.add_argument("--build", action="append", default=[], metavar="LABEL=DIR[@DISPATCH]",
                        help="--gap: another build's llama-perplexity on the GPU (e.g. cublas=/tmp/dec/patched-cublas-bin)")
    parser.add_argument("--gpu-variant", action="append", default=[], metavar="NAME=ARGS",
                        help="--gap: the main build with more llama-perplexity arguments, e.g. fa-off='-fa off'")
    args = parser.parse_args()
    if args.ctx < 128 or (args.chunks is not None and args.chunks < 1):
        print(f"error: --ctx {args.ctx} / --chunks {args.chunks}: need ctx >= 128 and chunks >= 1", file=sys.stderr)
        return 2
    dispatches = args.dispatches.split(",")
    variants = {}
    for v in args.gpu_variant:
        name, sep, rest = v.partition("=")
        if not sep or not name:
            parser.error(f"--gpu-variant {v!r}: write NAME=ARGS, e.g. fa-off='-fa off'")
        variants[name] = tuple(rest.split())
    if set(dispatches) - set(dsp.DISPATCHES):
        parser.error(f"--dispatches {args.dispatches}: choose from {', '.join(dsp.DISPATCHES)}")
    dispatcher = dsp.from_args(args, build_dir=args.work or args.out)
    try:
        with tempfile.TemporaryDirectory(prefix="pyllm-kld-") as tmp:
            work = (args.work or Path(tmp)).resolve()
            if args.gap:
                result = kld_gap.gap(args.bin.resolve(), args.model.resolve(), args.out.resolve(), work,
                                     dispatcher=dispatcher, dispatches=dispatches, builds=kld_gap.parse_builds(args.build),
                                     types=args.types.split(","), corpus=args.corpus.resolve(), ctx=args.ctx,
                                     chunks=args.chunks, threads=args.threads[0] if args.threads else None,
                                     gpu_args=variants, gpu=not args.cpu_only)
                print(kld_gap.table(result))
                return 1 if result["errors"] else 0
            result = kld.check(args.bin.resolve(), args.model.resolve(), args.out.resolve(), work,
                               corpus=args.corpus.resolve(), ctx=args.ctx, chunks=args.chunks, threads=args.threads,
                               gpu=not args.cpu_only, self_check=args.self_check,
                               gpu_env=dispatcher.env(args.dispatch))
    except (kld.KldError, OSError, dsp.DispatchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(kld.summary(result))
    return 1 if result["verdict"]["pass"] is False else 0


if __name__ == "__main__":
    sys.exit(main())
