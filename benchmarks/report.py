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
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's renderer (no native build needed)

from pyllm_a100.bench.report import render  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--write", type=Path, default=HERE.parent / "docs" / "benchmarks.md")
    args = parser.parse_args()
    args.write.write_text(render(args.results))
    print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
