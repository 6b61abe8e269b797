"""docs/performance.md's multi-token sections (lab/bench/multitoken.py) from the committed results."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from lab.bench import multitoken as mt
from lab.tests import fakes
from pyllm_a100.bench.verify import expected_tokens
from pyllm_a100.bench.speculate import acceptance_for

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "lab" / "results"


def committed(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def section(text: str, markers: tuple[str, str]) -> str:
    return text.split(markers[0] + "\n")[1].split(markers[1])[0]


def report(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    perf = tmp_path / "performance.md"
    if not perf.exists():
        shutil.copy(REPO / "docs" / "performance.md", perf)
    return fakes.program("lab.benchmarks.report", "--write", str(tmp_path / "benchmarks.md"), "--performance", str(perf),
                         *extra, timeout=120)


def test_the_committed_docs_say_what_the_committed_results_give() -> None:
    perf = (REPO / "docs" / "performance.md").read_text()
    assert section(perf, mt.MULTITOKEN_TABLE) == mt.render(committed("gpu-multitoken.json"))
    assert section(perf, mt.MULTITOKEN_SHAPES) == mt.render_shapes(committed("gpu-multitoken-shapes.json"))
    text = mt.render(committed("gpu-multitoken.json"))
    assert "| native | pin |" in text and "| a100 | patched |" in text and "Projection, not a measurement" in text


def test_report_renders_the_sections_between_the_markers_and_checks_them(tmp_path: Path) -> None:
    none = str(tmp_path / "none.json")
    assert report(tmp_path, "--multitoken", none, "--multitoken-shapes", none).returncode == 0
    perf = (tmp_path / "performance.md").read_text()
    assert "not measured yet" in section(perf, mt.MULTITOKEN_TABLE) and "<!-- perf-table -->" in perf  # the other table stays
    assert "not measured yet" in section(perf, mt.MULTITOKEN_SHAPES)
    assert "not measured yet" in mt.render({"rows": []}) and "not measured yet" in mt.render_shapes({"rows": []})
    assert report(tmp_path, "--check").returncode == 1  # the document says "not measured yet", the results do not
    assert report(tmp_path).returncode == 0 and report(tmp_path, "--check").returncode == 0
    assert (tmp_path / "performance.md").read_text() == (REPO / "docs" / "performance.md").read_text()


def test_ceilings_take_the_best_width_against_the_weights_read_and_against_the_measured_step() -> None:
    rows = committed("gpu-multitoken-shapes.json")["rows"]
    items = mt.ceilings(rows)
    assert items and all(c["experts"] for c in items)  # only the files whose weights the run recorded
    for c in items:
        row = next(r for r in rows if (r["model"], r["layers"], r.get("experts")) == (c["model"], c["layers"], c["experts"])
                   and r.get("weights_read"))
        w = {x["k"]: x["ratio"] for x in row["weights_read"]}
        a = acceptance_for(c["accept_len"], mt.K_REF)
        gains = {k: expected_tokens(a, k - 1) / w[k] for k in range(2, mt.K_REF + 2) if k in w}  # up to DSpark's block
        best = max(gains, key=gains.get)
        assert c["bound"] == {"k": best, "x": round(gains[best], 2)} and c["bound"]["x"] < 8
    no_weights = [dict(r, weights_read=None) for r in rows]
    assert mt.ceilings(no_weights) == [] and "tokens a step" not in mt.render_shapes({"gpu": "x", "rows": no_weights})
