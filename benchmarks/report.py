#!/usr/bin/env python3
"""Render docs/benchmarks.md from the measured figures (never edit that file by hand).

    python benchmarks/report.py [--results benchmarks/results] [--write docs/benchmarks.md]

Inputs: results/cpu.json from benchmarks/run.py (this machine) and results/gpu.json from
benchmarks/gpu.py (the GPU machine; copied from its output folder); the serving figures
(concurrency, verify cost, draft runs) from results/gpu-serving-bench.json (benchmarks/gpu.py
--phases concurrency,verify,speculative --results gpu-serving-bench.json) and
results/cpu-serving-bench.json (benchmarks/gpu.py --cpu, this machine). Any may be missing:
its section then says so.
"""


from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's renderer (no native build needed)

from pyllm_a100.bench.decode_results import summarize  # noqa: E402
from pyllm_a100.bench.report import render  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--write", type=Path, default=HERE.parent / "docs" / "benchmarks.md")
    parser.add_argument("--decode", type=Path, default=HERE.parent / "docs" / "results" / "gpu-decode.json",
                        help="issue 23's decode-path summary (scripts/gpu-decode report, then --summarize-decode)")
    parser.add_argument("--summarize-decode", type=Path, metavar="RAW",
                        help="first write --decode from scripts/gpu-decode's raw gpu-decode.json (docs/results/gpu-decode-raw.json)")
    args = parser.parse_args()
    if args.summarize_decode:
        summary = summarize(json.loads(args.summarize_decode.read_text()))
        args.decode.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {args.decode}")
    args.write.write_text(render(args.results, args.decode if args.decode.is_file() else None))
    print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
