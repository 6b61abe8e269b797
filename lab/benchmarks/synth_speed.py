"""`pyllm synth` throughput and peak RSS: this checkout's synth.py vs git revision REV, side by side.

    python -m lab.benchmarks.synth_speed --baseline REV [--rounds 6] [--preset deepseek-v4-flash --layers 1]

Each round writes the model once per side, each in a fresh process (its own peak RSS), the
sides interleaved and alternating which goes first; the file is deleted after each write.
Prints every write and the median MB/s of each side with their ratio (on a shared machine
read ratios within about +-5 % of 1.0 as equal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ONE = r"""
import json, sys
from pyllm_a100.synth import synthesize  # the tree on PYTHONPATH
r = synthesize(sys.argv[1], sys.argv[2], layers=int(sys.argv[3]), seed=42)
print(json.dumps({"mb_s": r.mb_per_s, "rss_mib": r.peak_rss / 2**20, "bytes": r.bytes_written}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, metavar="REV", help="git revision whose synth.py is the other side")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--preset", default="deepseek-v4-flash")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()), help="folder the models are written to")
    args = parser.parse_args()
    from pyllm_a100.llamacpp.native import native_dir

    old = Path(tempfile.mkdtemp(prefix="synth-baseline-"))
    packed = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "pyllm_a100"], check=True, capture_output=True).stdout
    tarfile.open(fileobj=BytesIO(packed)).extractall(old)
    sources = {f"at {args.baseline}": old, "this checkout": REPO}
    env = dict(os.environ, PYLLM_NATIVE_DIR=str(native_dir()))  # the exported trees have no build of their own
    results: dict[str, list[dict]] = {side: [] for side in sources}
    for i in range(args.rounds):
        for side in (list(sources) if i % 2 == 0 else list(reversed(sources))):
            path = args.out / f"synth-speed-{i}.gguf"
            run = subprocess.run([sys.executable, "-c", ONE, args.preset, str(path), str(args.layers)], capture_output=True,
                                 text=True, env=dict(env, PYTHONPATH=str(sources[side])), cwd=tempfile.gettempdir())
            path.unlink(missing_ok=True)
            if run.returncode != 0:
                raise SystemExit(f"{side}: {run.stderr[-1500:]}")
            result = json.loads(run.stdout.strip().splitlines()[-1])
            results[side].append(result)
            print(f"round {i + 1} {side}: {result['bytes'] / 2**20:.0f} MiB, {result['mb_s']:.0f} MB/s, "
                  f"peak RSS {result['rss_mib']:.0f} MiB", flush=True)
    medians = {side: statistics.median(r["mb_s"] for r in rs) for side, rs in results.items()}
    for side, rs in results.items():
        print(f"{side}: median {medians[side]:.0f} MB/s, peak RSS up to {max(r['rss_mib'] for r in rs):.0f} MiB")
    base, this = medians.values()
    print(f"ratio this checkout / {args.baseline}: {this / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
