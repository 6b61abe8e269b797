"""The KL-divergence check (lab/gpucheck/kld.py, lab/runs/gpu_kld.py) on the CPU with the real SmolLM2 and this
build's llama-quantize and llama-perplexity; its rule; and how lab/tools/render_compat.py reads its result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.gpucheck import kld
from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]


def native() -> Path:
    from pyllm_a100.llamacpp.native import native_dir

    return native_dir()


def test_the_package_ships_the_kld_tools_and_its_corpus() -> None:
    assert set(kld.tools(native())) == {"llama-perplexity", "llama-quantize"}
    words = kld.CORPUS.read_text().split()
    assert len(words) > 2000 and len(set(words)) > 800  # varied prose, not a repeated line


def test_kld_pipeline_on_the_cpu_gives_sane_figures(smollm2: Path, tmp_path: Path) -> None:
    """Two chunks of 256 tokens: F32 vs its own base ~0, Q4_1 vs F32 clearly above it, top-token % in (0, 100]."""
    result = kld.check(native(), smollm2, tmp_path / "out", tmp_path / "work", ctx=256, chunks=2, threads=(2, 1),
                       gpu=False, self_check=True)
    assert json.loads((tmp_path / "out" / "gpu-kld.json").read_text()) == result
    assert result["base"]["corpus_tokens_used"] == 512 and result["base"]["threads"] == 2
    me, runs = result["self"], result["runs"]
    assert [r["threads"] for r in runs] == [2, 1] and all(r["device"] == "cpu" and not r["gpu_buffers"] for r in runs)
    assert all(r["offloaded"].startswith("0/") for r in runs), runs  # the load summary was read (-lv 4)
    assert me["kld_mean"] < 1e-3 and me["same_top_pct"] > 99 and abs(me["ppl_ratio"] - 1) < 1e-2, me
    for r in runs:
        assert r["scored_tokens"] == 2 * 127
        assert r["kld_mean"] > 10 * max(me["kld_mean"], 1e-4), r
        assert 0 < r["same_top_pct"] < 100 and r["kld_99_9"] >= r["kld_mean"] > 0 and r["ppl_ratio"] > 0, r
    assert result["verdict"]["pass"] is None  # no GPU run


def cpu_run(label: str, **figures) -> dict:
    base = {"kld_mean": 0.1, "kld_mean_err": 0.002, "kld_99_9": 2.0, "kld_99": 1.0, "same_top_pct": 85.0,
            "same_top_err": 0.8, "ppl_ratio": 1.1, "ppl_ratio_err": 0.01}
    return {"label": label, "device": "cpu" if label.startswith("cpu") else "gpu", **base, **figures}


def test_rule_accepts_the_standard_error_when_the_cpu_runs_are_identical() -> None:
    runs = [cpu_run("cpu-a"), cpu_run("cpu-b"), cpu_run("gpu", kld_mean=0.103, same_top_pct=84.5, kld_99_9=2.1)]
    assert kld.verdict(runs)["pass"] is True


@pytest.mark.parametrize("figure,value", [("kld_mean", 0.115), ("same_top_pct", 82.0), ("kld_99_9", 2.5),
                                          ("ppl_ratio", 1.2)])
def test_rule_rejects_a_gpu_figure_outside_the_cpu_noise(figure: str, value: float) -> None:
    verdict = kld.verdict([cpu_run("cpu-a"), cpu_run("cpu-b"), cpu_run("gpu", **{figure: value})])
    assert verdict["pass"] is False and [c["figure"] for c in verdict["checks"] if not c["ok"]] == [figure]


def test_rule_widens_with_the_spread_of_the_two_cpu_runs() -> None:
    runs = [cpu_run("cpu-a", kld_mean=0.09), cpu_run("cpu-b", kld_mean=0.11), cpu_run("gpu", kld_mean=0.125)]
    assert kld.verdict(runs)["pass"] is True  # 0.025 off the mean, within 2 x 0.02


def gpu_kld(*args: str) -> subprocess.CompletedProcess:
    return fakes.program("lab.runs.gpu_kld", *args, env=dict(os.environ), timeout=60)


@pytest.mark.parametrize("case", ["no-binaries", "no-model", "bad-threads"])
def test_gpu_kld_bad_input_is_one_line_and_nonzero(case: str, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    args = {"no-binaries": ["--bin", str(tmp_path), "--model", str(model)],
            "no-model": ["--bin", str(native()), "--model", str(tmp_path / "none.gguf")],
            "bad-threads": ["--bin", str(native()), "--model", str(model), "--threads", "8"]}[case]
    result = gpu_kld(*args, "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "error:" in result.stderr and "Traceback" not in result.stderr


def render_llama_row(results: Path) -> str:
    out = fakes.program("lab.tools.render_compat", "--print", "--results", str(results), env=dict(os.environ), timeout=120)
    out.check_returncode()
    out = out.stdout
    return next(line for line in out.splitlines() if "`llama`" in line)


@pytest.mark.parametrize("gpu_kld_mean,status", [(None, "verified on CPU only"), (0.1005, "verified on GPU"),
                                                  (0.2, "verified on CPU only")])
def test_render_compat_decides_the_llama_row_by_the_kld_result(gpu_kld_mean, status, tmp_path: Path) -> None:
    for path in (REPO / "lab" / "results").glob("gpu-*.json"):
        shutil.copy(path, tmp_path)
    before = render_llama_row(tmp_path)
    runs = [dict(cpu_run("cpu-t16"), threads=16), dict(cpu_run("cpu-t8"), threads=8)]
    if gpu_kld_mean is not None:
        runs.append(dict(cpu_run("gpu", kld_mean=gpu_kld_mean), threads=16))
    (tmp_path / "gpu-kld.json").write_text(json.dumps({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "runs": runs,
                                                       "base": {"corpus_tokens_used": 3072}}))
    row = render_llama_row(tmp_path)
    assert "verified on CPU only" in before  # the committed results: real weights part on the GPU
    assert f"| {status} |" in row and "KL divergence" in row, row
    assert ("no GPU run yet" in row) == (gpu_kld_mean is None)


def test_readme_states_the_rule_the_code_applies() -> None:
    """docs/models.md (the compatibility section, where the README points) states the rule the code applies."""
    assert kld.RULE in " ".join((REPO / "docs" / "models.md").read_text().split())
