"""python -m lab.benchmarks.report: the full benchmark report (lab/notes/benchmarks.md) from GPU-shaped results."""

from __future__ import annotations

import json
from pathlib import Path


def test_report_renders_the_serving_sections_of_a_gpu_run(tmp_path: Path) -> None:
    """python -m lab.benchmarks.report on a GPU-shaped results file (this machine's measured CPU figures, relabelled):
    the goal verdict, acceptance near 0 said plainly, the projection labelled with its formula, a skipped phase."""
    from lab.tests import fakes

    repo = Path(__file__).resolve().parents[2]
    data = json.loads((repo / "lab" / "benchmarks" / "results" / "cpu-serving-bench.json").read_text())
    data["gpus"] = [{"name": "NVIDIA H200", "compute_capability": "9.0", "memory_total": 150 << 30, "memory_bandwidth": 4.8e12}]
    spec = data["phases"]["speculative"]
    spec.update(model=data["phases"]["verify"]["model"], draft="synthetic DSpark draft (random weights)")
    spec["run"].update(accepted=1, drafted=700, acceptance=1 / 700, steps=250)
    (tmp_path / "gpu-serving-bench.json").write_text(json.dumps(data))
    out, perf = tmp_path / "benchmarks.md", tmp_path / "performance.md"
    perf.write_text("<!-- perf-table -->\n<!-- /perf-table -->\n")
    result = fakes.program("lab.benchmarks.report", "--results", str(tmp_path), "--write", str(out), "--performance", str(perf),
                           timeout=120)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "### GPU: tiny-deepseek4.gguf" in text and "2x NVIDIA H200" not in text and "1x NVIDIA H200" in text
    assert "Aggregate at 16 streams against one stream (goal >= 6x)" in text
    assert "Acceptance is 0.001, i.e. about 0" in text and "random" in text
    assert "**Projection, not a measurement**" in text and "E = (1 - a^(k+1)) / (1 - a)" in text
    assert "T_draft(k) = k x" in text, "the draft run served the verify model: its overhead feeds the projection"
    del data["phases"]["speculative"]["run"]
    data["phases"]["speculative"]["skipped"] = "this package has no deepseek-v4-flash-dspark preset yet"
    (tmp_path / "gpu-serving-bench.json").write_text(json.dumps(data))
    fakes.program("lab.benchmarks.report", "--results", str(tmp_path), "--write", str(out), "--performance", str(perf),
                  timeout=120).check_returncode()
    assert "**Draft run**: not measured: this package has no deepseek-v4-flash-dspark preset yet" in out.read_text()
