"""Generated documentation stays generated: the README's compatibility table is what the GPU results give."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RENDER = REPO / "scripts" / "render-compat"


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RENDER), *args], capture_output=True, text=True, timeout=120)


def test_readme_compatibility_table_is_the_rendered_one() -> None:
    result = render("--check")
    assert result.returncode == 0, result.stderr


def test_status_follows_the_results(tmp_path: Path) -> None:
    """A preset that fails on the GPU is 'verified on CPU only'; passing in a later run moves it to 'verified on GPU'."""
    def run(started: str, **outcome) -> dict:
        return {"started": started, "steps": {}, "presets": [{"preset": "tiny-glm-dsa", "server_tokens_equal": True,
                                                               "in_process_tokens_equal": True, **outcome}]}

    (tmp_path / "gpu-check-a.json").write_text(json.dumps(run(
        "2026-01-01 00:00:00 UTC", server_tokens_equal=False, logits_nmse=9e-3, first_difference=8, cpu_top2_gap=0.001,
        pass_server=False, pass_in_process=False)))
    before = render("--print", "--results", str(tmp_path)).stdout
    (tmp_path / "gpu-check-b.json").write_text(json.dumps(run(
        "2026-02-01 00:00:00 UTC", logits_nmse=2e-6, pass_server=True, pass_in_process=True)))
    after = render("--print", "--results", str(tmp_path)).stdout

    def row(text: str, arch: str) -> str:
        return next(line for line in text.splitlines() if f"`{arch}`" in line)

    assert "verified on CPU only" in row(before, "glm-dsa") and "tokens part at token 9" in row(before, "glm-dsa")
    assert "verified on GPU" in row(after, "glm-dsa") and "NMSE 2.0e-06" in row(after, "glm-dsa")
    assert "no GPU check of this preset yet" in row(after, "deepseek4")
    assert "2026-01-01, 2026-02-01" in after


def test_benchmarks_md_is_the_rendered_one(tmp_path: Path) -> None:
    """docs/benchmarks.md is generated from benchmarks/results/*.json, never edited by hand."""
    out = tmp_path / "benchmarks.md"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "report.py"), "--write", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == (REPO / "docs" / "benchmarks.md").read_text(), "run: python benchmarks/report.py"
