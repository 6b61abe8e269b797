"""Render lab/notes/benchmarks.md (every measured figure) and the short tables of docs/performance.md from the
measured results (never edit either by hand).

    python -m lab.benchmarks.report [--results lab/benchmarks/results] [--write lab/notes/benchmarks.md]

Inputs: results/cpu.json from lab/benchmarks/run.py (this machine); results/gpu.json, gpu-serving-bench.json and
cpu-serving-bench.json from lab/benchmarks/gpu.py (its phases on the GPU machine, and --cpu here; it left the tree with
issue 60: git show cf107d3:lab/benchmarks/gpu.py). Any may be missing: its section then says so. The multi-token
sections of docs/performance.md (multitoken-table, multitoken-shapes markers) come from lab/results/gpu-multitoken.json
and gpu-multitoken-shapes.json (lab/bench/multitoken.py; "not measured yet" while they do not exist), the agent-team
section (agents-table markers) from lab/results/cpu-agents.json (python -m lab.benchmarks.agents, issue 40).
"""


from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

from lab.bench.agents_table import AGENTS_TABLE
from lab.bench.agents_table import render as agents_section
from lab.bench.decode_results import summarize
from lab.bench.jsonrows import dumps
from lab.bench.multitoken import MULTITOKEN_SHAPES, MULTITOKEN_TABLE
from lab.bench.multitoken import render_shapes as multitoken_shapes_section
from lab.bench.multitoken import render as multitoken_section
from lab.bench.report import PERF_TABLE, perf_table, render, replace_between


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--write", type=Path, default=REPO / "lab" / "notes" / "benchmarks.md")
    parser.add_argument("--decode", type=Path, default=REPO / "lab" / "results" / "gpu-decode.json",
                        help="issue 23's decode-path summary (python -m lab.runs.gpu_decode report, then --summarize-decode)")
    parser.add_argument("--summarize-decode", type=Path, metavar="RAW",
                        help="first write --decode from python -m lab.runs.gpu_decode's raw gpu-decode.json (lab/results/gpu-decode-raw.json)")
    parser.add_argument("--performance", type=Path, nargs="+", default=[REPO / "docs" / "performance.md", REPO / "README.md"],
                        help="the documents whose short table (perf-table markers) is rendered from --decode")
    parser.add_argument("--multitoken", type=Path, default=REPO / "lab" / "results" / "gpu-multitoken.json",
                        help="issue 42's multi-token curves")
    parser.add_argument("--multitoken-docs", type=Path, nargs="+", help="the documents whose multitoken-table section is "
                        "rendered from --multitoken (default: those of --performance that have the markers)")
    parser.add_argument("--multitoken-shapes", type=Path, default=REPO / "lab" / "results" / "gpu-multitoken-shapes.json",
                        help="the multi-token curves of the other shapes (256 experts, GLM-5), where multitoken-shapes markers are")
    parser.add_argument("--agents", type=Path, default=REPO / "lab" / "results" / "cpu-agents.json",
                        help="issue 40's agent-team load (python -m lab.benchmarks.agents), rendered where agents-table markers are")
    parser.add_argument("--check", action="store_true", help="exit 1 if --write or --performance differ from what the results give")
    args = parser.parse_args()
    if args.summarize_decode:
        summary = summarize(json.loads(args.summarize_decode.read_text()))
        args.decode.write_text(dumps(summary))
        print(f"wrote {args.decode}")
    decode = args.decode if args.decode.is_file() else None
    outputs = {args.write: render(args.results, decode)}
    if decode is not None:
        short = perf_table(json.loads(decode.read_text()))
        outputs.update({path: replace_between(path.read_text(), PERF_TABLE, short) for path in args.performance})
    multitoken = multitoken_section(json.loads(args.multitoken.read_text()) if args.multitoken.is_file() else None)
    docs = args.multitoken_docs or [p for p in args.performance if MULTITOKEN_TABLE[0] in p.read_text()]
    for path in docs:
        outputs[path] = replace_between(outputs.get(path, path.read_text()), MULTITOKEN_TABLE, multitoken)
    shapes = multitoken_shapes_section(json.loads(args.multitoken_shapes.read_text()) if args.multitoken_shapes.is_file() else None)
    for path in [p for p in docs if MULTITOKEN_SHAPES[0] in outputs.get(p, p.read_text())]:
        outputs[path] = replace_between(outputs[path], MULTITOKEN_SHAPES, shapes)
    agents = agents_section(json.loads(args.agents.read_text()) if args.agents.is_file() else None)
    for path in [p for p in args.performance if AGENTS_TABLE[0] in p.read_text()]:
        outputs[path] = replace_between(outputs.get(path, path.read_text()), AGENTS_TABLE, agents)
    for path, text in outputs.items():
        if args.check:
            if not path.is_file() or path.read_text() != text:
                print(f"error: {path} is not what the results give: run python -m lab.benchmarks.report", file=sys.stderr)
                return 1
            continue
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
