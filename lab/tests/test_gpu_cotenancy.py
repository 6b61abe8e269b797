"""lab.runs.gpu_cotenancy on the CPU build: its rows end to end against real llama-servers of the installed package on
the tiny DeepSeek-V4 (skipped until the package has `pyllm bench cotenancy`'s library), the ncu stage's plumbing
over a stand-in ncu, and the idle-share arithmetic (lab/bench/idle.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import idle
from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]


def library_present() -> bool:
    """Whether the run (python -m from the checkout, as fakes.program starts it) finds the co-tenancy library."""
    probe = subprocess.run([sys.executable, "-c", "import pyllm_a100.bench.cotenancy"], cwd=REPO, capture_output=True,
                           env=fakes.env_without_preload(), timeout=60)
    return probe.returncode == 0


def latency_flag(native_dir: Path) -> bool:
    text = subprocess.run([str(native_dir / "llama-server"), "--help"], capture_output=True, text=True, timeout=60)
    return "--decode-latency-target" in text.stdout + text.stderr


@pytest.fixture(scope="module")
def tiny_v4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllm_a100.synth import synthesize

    return synthesize("tiny-deepseek4", tmp_path_factory.mktemp("cot") / "tiny-v4.gguf", seed=42).first


def test_rows_of_a_stream_beside_a_long_prompt(tiny_v4: Path, tmp_path: Path, native_dir: Path) -> None:
    if not library_present():
        pytest.skip("pyllm_a100.bench.cotenancy is not in this checkout yet (issue 55's `pyllm bench cotenancy`)")
    flag = latency_flag(native_dir)  # without the scheduler patch: the baseline is llama.cpp's own flags only
    settings = "baseline,defaults,target50" if flag else "baseline,defaults"
    base = [] if flag else ["--baseline-args", "-b 2048 -ub 512"]
    work, out = tmp_path / "w", tmp_path / "out"
    result = fakes.program(
        "lab.runs.gpu_cotenancy", "--work", str(work), "--models", str(tiny_v4), "--columns", "pyllm", "--settings",
        settings, *base, "--ctx-size", "8192", "--prompt-tokens", "600", "--short-tokens", "50", "--server-args=-t 1",
        "rows", env=dict(fakes.env_without_preload(), OUT=str(out)), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((out / "gpu-cotenancy.json").read_text())
    assert data["commands"][0].startswith("python -m lab.runs.gpu_cotenancy --work") and data["load"]["prompt_tokens"] == 600
    rows = {r["setting"]: r for r in data["rows"]}
    assert list(rows) == settings.split(",")
    baseline = rows["baseline"]
    for name, r in rows.items():
        assert (r["dispatch"], r["model"], r["layers"], r["parallel"]) == ("native", "tiny-v4", 4, 3)
        assert r["solo_tps"] > 0 and r["during_tps"] > 0 and r["prefill_s"] > 0 and r["short_ttft_s"] > 0
        assert 0 < r["gap_p50_ms"] <= r["gap_p99_ms"] <= r["gap_max_ms"]
        assert r["baseline_prefill_s"] == baseline["prefill_s"] and not r.get("error")
        assert r["same_stream_tokens_as_baseline"] is True  # scheduling changes when tokens come, not which
        assert r["argv"].startswith(str(native_dir / "llama-server")) and "--parallel 3" in r["argv"]
    if flag:  # llama.cpp's own scheduling: none of pyllm serve's scheduling flags, llama-server's defaults
        assert "--decode-latency-target" not in baseline["argv"] and "--batch-size" not in baseline["argv"]
        assert "--decode-latency-target 100" in rows["defaults"]["argv"]
    else:
        assert "-b 2048 -ub 512" in baseline["argv"]
    if flag:
        assert "--decode-latency-target 50" in rows["target50"]["argv"]


def test_settings_and_columns_are_checked_before_anything_runs(tmp_path: Path) -> None:
    bad = fakes.program("lab.runs.gpu_cotenancy", "--work", str(tmp_path), "--settings", "baseline,fast", "rows", timeout=60)
    assert bad.returncode == 2 and "--settings fast" in bad.stderr
    col = fakes.program("lab.runs.gpu_cotenancy", "--work", str(tmp_path), "--columns", "patched@a100", "rows", timeout=60)
    assert col.returncode == 2 and "the package's own build" in col.stderr


# A stand-in ncu: the CSV ncu --csv --print-units base writes for two launches of a decode step, at --log-file
FAKE_NCU = r'''
import sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
head = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
launches = [("0", "void mul_mat_vec_q<39, 1, 1, 0, 0>(int)", "(32, 4, 1)", "(20, 1, 1)",
             {"gpu__time_duration.sum": ("nsecond", 10000), "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", 40),
              "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", 30), "sm__cycles_active.avg": ("cycle", 500),
              "sm__cycles_elapsed.avg": ("cycle", 1000), "launch__grid_size": ("", 20)}),
            ("1", "void rms_norm_f32<1024>(float)", "(1024, 1, 1)", "(264, 1, 1)",
             {"gpu__time_duration.sum": ("usecond", 30), "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", 80),
              "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", 60), "sm__cycles_active.avg": ("cycle", 2000),
              "sm__cycles_elapsed.avg": ("cycle", 2000), "launch__grid_size": ("", 264)})]
with open(log, "w") as f:
    f.write("==PROF== Connected to process\n" + head + "\n")
    for i, name, block, grid, metrics in launches:
        for metric, (unit, value) in metrics.items():
            f.write(f'"{i}","1","llama-bench","h","{name}","1","7","{block}","{grid}","0","9.0","","{metric}","{unit}","{value}"\n')
print("==PROF== Disconnected")
'''


def test_the_ncu_stage_records_a_steps_idle_shares(tmp_path: Path) -> None:
    fake = fakes.write(tmp_path / "bin", "ncu", FAKE_NCU)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    env = dict(fakes.env_without_preload(), PATH=f"{fake.parent}:{fakes.env_without_preload()['PATH']}", OUT=str(tmp_path / "o"))
    result = fakes.program("lab.runs.gpu_cotenancy", "--work", str(tmp_path / "w"), "--ncu-model", str(model),
                           "--ncu-columns", "pyllm", "ncu", env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    row = json.loads((tmp_path / "o" / "gpu-cotenancy.json").read_text())["rows"][0]
    assert (row["kind"], row["model"], row["column"], row["dispatch"]) == ("ncu", "m", "pyllm", "native")
    for what, flag in (("decode", "-p 0 -n 1"), ("prefill", "-p 512 -n 0")):
        step = row[what]
        assert step["how"] == "metrics" and flag in step["command"] and "--graph-profiling node" in step["command"]
        assert (step["launches"], step["kernel_ms"]) == (2, 0.04)
        assert (step["sm_idle_share"], step["issue_idle_share"]) == (0.125, 0.3)  # (10x0.5 + 30x1) / 40; (4 + 24) / 40
        assert step["kernels"][0]["kernel"] == "rms_norm_f32 grid(264, 1, 1) block(1024, 1, 1)"


def test_few_block_kernels_are_counted_against_the_gpus_sms() -> None:
    rows = [{"kernel": "k1", "grid_text": "(20,1,1)", "block_text": "(32,1,1)", "duration_ns": 10.0, "grid": 20.0},
            {"kernel": "k2", "grid_text": "(264,1,1)", "block_text": "(32,1,1)", "duration_ns": 30.0, "grid": 264.0}]
    s = idle.summarize(rows, n_sm=132)
    assert s["few_block_share"] == 0.25 and s["sm_idle_share"] is None and s["kernel_ms"] == 0.0
    assert idle.launches("no table here") == []
