"""Generated documentation stays generated: the README's compatibility table is what the GPU results give."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]


def render(*args: str) -> subprocess.CompletedProcess:
    return fakes.program("lab.tools.render_compat", *args, timeout=120)


def test_readme_compatibility_table_is_the_rendered_one() -> None:
    result = render("--check")
    assert result.returncode == 0, result.stderr


def test_tool_column_and_thinking_table_come_from_the_chat_formats(tmp_path: Path) -> None:
    """Each family's row names the markup and thinking switch of pyllm_a100/synth/chat.py; the README's thinking
    table (checked by --check above) is rendered from the same entries."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("chat_formats", REPO / "pyllm_a100" / "synth" / "chat.py")
    chat = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = chat
    spec.loader.exec_module(chat)
    rows = render("--print", "--results", str(tmp_path)).stdout.splitlines()
    for arch, fmt in chat.CHAT_FORMATS.items():
        (row,) = [line for line in rows if f"| `{arch}` |" in line]
        assert row.rstrip(" |").endswith(f"{fmt.tool_calls} ({fmt.parser}); thinking off: `chat_template_kwargs` {fmt.switches()}")
    readme = (REPO / "docs" / "serving.md").read_text()
    table = readme.split("<!-- thinking-table -->")[1].split("<!-- /thinking-table -->")[0]
    assert all(f"`{fmt.template}`" in table and fmt.switches() in table for fmt in chat.CHAT_FORMATS.values())


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


def test_performance_tables_are_the_rendered_ones() -> None:
    """docs/performance.md's and README.md's short tables are rendered from lab/results/gpu-decode.json."""
    result = fakes.program("lab.benchmarks.report", "--check", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "| decode, one stream (llama-bench tg64), tokens/s |" in (REPO / "README.md").read_text()


def test_benchmarks_md_is_the_rendered_one(tmp_path: Path) -> None:
    """lab/notes/benchmarks.md is generated from lab/benchmarks/results/*.json, never edited by hand."""
    out, perf = tmp_path / "benchmarks.md", tmp_path / "performance.md"
    shutil.copy(REPO / "docs" / "performance.md", perf)
    result = fakes.program("lab.benchmarks.report", "--write", str(out), "--performance", str(perf), timeout=120)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == (REPO / "lab" / "notes" / "benchmarks.md").read_text(), "run: python -m lab.benchmarks.report"


def test_llama_row_cites_the_real_weight_run_only_from_a_gpu(tmp_path: Path) -> None:
    """gpu-check --real-model: a GPU run is cited in the llama row (and must pass too); a CPU-only run is not evidence."""
    tiny = {"preset": "tiny-llama", "server_tokens_equal": True, "in_process_tokens_equal": True, "logits_nmse": 6e-6,
            "pass_server": True, "pass_in_process": True}

    def write(name: str, started: str, on_gpu: bool, **outcome) -> None:
        real = {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "n_predict": 64, "gpu_side_on_gpu": on_gpu,
                "server_tokens_equal": True, "in_process_tokens_equal": True, "logits_nmse": 2e-6,
                "pass_server": True, "pass_in_process": True, **outcome}
        (tmp_path / name).write_text(json.dumps({"started": started, "presets": [tiny],
                                                 "steps": {"real model": {"ok": True, "result": real}}}))

    def llama_row() -> str:
        out = render("--print", "--results", str(tmp_path)).stdout
        return next(line for line in out.splitlines() if "`llama`" in line)

    write("gpu-check-cpu.json", "2026-01-01 00:00:00 UTC", on_gpu=False)
    assert "real weights" not in llama_row() and "verified on GPU" in llama_row()
    write("gpu-check-gpu.json", "2026-02-01 00:00:00 UTC", on_gpu=True)
    assert "real weights, `SmolLM2-135M-Instruct.Q4_1`: 64/64 tokens GPU = CPU (server and in-process), logits NMSE 2.0e-06" in llama_row()
    write("gpu-check-gpu2.json", "2026-03-01 00:00:00 UTC", on_gpu=True, server_tokens_equal=False, logits_nmse=3e-3,
          first_difference=20, pass_server=False, pass_in_process=False)
    row = llama_row()
    assert "verified on CPU only" in row and "differ on the GPU: tokens part at token 21 of 64, logits NMSE 3.0e-03 > 1e-4" in row


def test_decode_summary_is_the_one_the_raw_run_gives() -> None:
    """lab/results/gpu-decode.json (issue 23) is summarized from the committed raw lab.runs.gpu_decode output, never typed."""
    from lab.bench.decode_results import summarize

    raw = json.loads((REPO / "lab" / "results" / "gpu-decode-raw.json").read_text())
    committed = json.loads((REPO / "lab" / "results" / "gpu-decode.json").read_text())
    assert committed == summarize(raw), "run: python -m lab.benchmarks.report --summarize-decode lab/results/gpu-decode-raw.json"
    row = next(r for r in committed["rows"] if r["layers"] == 43)
    assert {"model", "layers", "pin_tps", "patched_tps"} <= set(row)
    # an op that failed on the GPU is either fixed in a rerun or explained, by name, in the run's ops_note
    failing = [op for op, v in committed["test_backend_ops"].items() if v["patched"]["failed"]]
    assert all(op in committed.get("ops_note", "") for op in failing), f"{failing} failed on the GPU and no ops_note says why"


def kld_run(label: str, **figures) -> dict:
    base = {"kld_mean": 0.1, "kld_mean_err": 0.002, "kld_99_9": 2.0, "kld_99": 1.0, "same_top_pct": 85.0,
            "same_top_err": 0.8, "ppl_ratio": 1.1, "ppl_ratio_err": 0.01}
    return {"label": label, "device": "cpu" if label.startswith("cpu") else "gpu", "threads": 16, **base, **figures}


@pytest.mark.parametrize("gpu,ok", [({"kld_mean": 0.103, "same_top_pct": 84.5, "kld_99_9": 2.1}, True),  # within the error
                                    ({"kld_mean": 0.115}, False), ({"same_top_pct": 82.0}, False),
                                    ({"kld_99_9": 2.5}, False), ({"ppl_ratio": 1.2}, False)])
def test_kld_rule_takes_the_standard_error_and_rejects_a_figure_outside_the_cpu_noise(gpu: dict, ok: bool) -> None:
    from lab.tools.render_compat import kld_verdict

    verdict = kld_verdict([kld_run("cpu-a"), kld_run("cpu-b"), kld_run("gpu", **gpu)])
    assert verdict["pass"] is ok and [c["figure"] for c in verdict["checks"] if not c["ok"]] == ([] if ok else list(gpu))
    wide = [kld_run("cpu-a", kld_mean=0.09), kld_run("cpu-b", kld_mean=0.11), kld_run("gpu", kld_mean=0.125)]
    assert kld_verdict(wide)["pass"] is True  # 0.025 off the mean, within 2 x the CPU runs' spread


@pytest.mark.parametrize("gpu_kld_mean,status", [(None, "verified on CPU only"), (0.1005, "verified on GPU"),
                                                  (0.2, "verified on CPU only")])
def test_the_llama_row_follows_the_kld_result(gpu_kld_mean, status, tmp_path: Path) -> None:
    from lab.tools.render_compat import RULE

    assert RULE in " ".join((REPO / "docs" / "models.md").read_text().split())  # the docs state the rule applied
    for path in (REPO / "lab" / "results").glob("gpu-*.json"):
        shutil.copy(path, tmp_path)
    runs = [kld_run("cpu-t16"), dict(kld_run("cpu-t8"), threads=8)] + ([] if gpu_kld_mean is None else [
        kld_run("gpu", kld_mean=gpu_kld_mean)])
    (tmp_path / "gpu-kld.json").write_text(json.dumps({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "runs": runs,
                                                       "base": {"corpus_tokens_used": 3072}}))
    row = next(line for line in render("--print", "--results", str(tmp_path)).stdout.splitlines() if "`llama`" in line)
    assert f"| {status} |" in row and "KL divergence" in row and ("no GPU run yet" in row) == (gpu_kld_mean is None), row
