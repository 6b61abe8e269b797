"""`pyllm bench MODEL --profile`: ncu's per-node table turned into one decode step (the parsing runs here; ncu itself
only on the GPU machine, where lab/results/gpu-decode.json came from)."""

from __future__ import annotations

from pathlib import Path

from conftest import run_pyllm

import pytest

from pyllm_a100.bench.profile import KernelRow, ProfileError, forward_difference, kernel_table, launch_metrics, one_step

HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n'


def row(i: int, name: str, value: str, unit: str = "nsecond", metric: str = "gpu__time_duration.sum",
        grid: str = "(2048, 6, 1)") -> str:
    return f'"{i}","1","llama-bench","h","{name}","1","7","(128, 1, 1)","{grid}","0","9.0","Command line profiler metrics","{metric}","{unit}","{value}"\n'


Q8 = "void mul_mat_vec_q<8, 1, 0, 0, 0>(const void *, const void *, const int *)"
MOE = "void mul_mat_vec_q<39, 1, 1, 0, 0>(const void *, const void *, const int *)"
NORM = "void rms_norm_f32<256, true>(const float *, float *)"


def test_one_step_is_what_two_tokens_ran_beyond_one() -> None:
    prelude = "==PROF== Connected to process 1\nllama-bench output\n"
    one = prelude + HEADER + row(1, Q8, "2,000") + row(2, NORM, "3000") + row(3, NORM, "1", metric="sm__cycles")
    two = HEADER + row(1, Q8, "2000") + row(2, NORM, "3000") + row(3, Q8, "2.5", "usecond") + row(4, MOE, "40000") + row(5, NORM, "3000")
    first, second = kernel_table(one), kernel_table(two)
    assert first[NORM] == (1, 3.0) and first[Q8] == (1, 2.0)  # thousands separators, ns -> us, other metrics ignored
    step = one_step(first, second)
    assert step == [KernelRow("mul_mat_vec_q MXFP4 (experts)", 1, 40.0), KernelRow("rms_norm_f32", 1, 3.0),
                    KernelRow("mul_mat_vec_q Q8_0", 1, 2.5)]


def test_forward_difference_keeps_each_launch_shape_apart() -> None:
    """lab.runs.gpu_decode's ncu stage: the second run's extra forward, by kernel name and by launch shape."""
    one = HEADER + row(1, Q8, "2000") + row(2, MOE, "40000")
    two = one + row(3, Q8, "2500") + row(4, Q8, "1000", grid="(16, 1, 1)") + row(5, MOE, "30000")
    tables = [{kind: {k: list(v) for k, v in kernel_table(t, by_launch=kind == "launch").items()} for kind in ("name", "launch")}
              for t in (one, two)]
    diff = forward_difference(*tables)
    assert diff["name"] == {MOE: {"count": 1, "total_us": 30.0}, Q8: {"count": 2, "total_us": 3.5}}
    assert [v["count"] for v in diff["launch"].values()] == [1, 1, 1] and diff["kernels_per_forward"] == 3
    assert diff["kernel_us_per_forward"] == 33.5 and diff["raw_counts"] == {"n1": 2, "n2": 5}


def test_profile_without_ncu_is_one_line(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}  # no ncu here
    result = run_pyllm("bench", str(tiny_models["tiny-llama"]), "--profile", env=env, timeout=60)
    assert result.returncode == 1 and "--profile needs ncu (Nsight Compute) on PATH" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_profile_needs_a_model_and_runs_alone(tiny_models: dict[str, Path]) -> None:
    result = run_pyllm("bench", "--url", "http://127.0.0.1:9", "--profile", timeout=60)
    assert result.returncode == 1 and "--profile starts the model itself: give a MODEL" in result.stderr, result.stderr
    both = run_pyllm("bench", str(tiny_models["tiny-llama"]), "--profile", "--verify-cost", "1-4", timeout=60)
    assert both.returncode == 1 and "--verify-cost and --profile are separate benchmarks" in both.stderr, both.stderr


def test_launch_metrics_average_each_launch_shape_and_keep_the_largest_stalls() -> None:
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    text = "==PROF== Connected\n" + HEADER
    for i, (grid, us, scoreboard) in enumerate([("(32768, 1, 1)", "40000", "9.5"), ("(32768, 1, 1)", "38000", "10.5"),
                                                 ("(8192, 1, 1)", "12000", "2")], start=1):
        text += row(i, Q8, us, grid=grid) + row(i, Q8, "61.5", "%", "dram__throughput.avg.pct_of_peak_sustained_elapsed", grid)
        text += row(i, Q8, scoreboard, "", stall.format("long_scoreboard"), grid) + row(i, Q8, "0.5", "", stall.format("wait"), grid)
        text += row(i, Q8, "n/a", "", "launch__occupancy_limit_registers", grid)  # not a number: skipped
    shapes = launch_metrics(text)
    big, small = shapes["void mul_mat_vec_q<8, 1, 0, 0, 0> grid(32768, 1, 1)"], shapes["void mul_mat_vec_q<8, 1, 0, 0, 0> grid(8192, 1, 1)"]
    assert list(shapes)[0].endswith("grid(32768, 1, 1)")  # the most time first
    assert big["launches"] == 2 and big["gpu__time_duration.sum"] == 39000.0 and big["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == 61.5
    assert big["stalls"] == {"long_scoreboard": 10.0, "wait": 0.5} and small["stalls"]["long_scoreboard"] == 2.0
    assert "launch__occupancy_limit_registers" not in big
    with pytest.raises(ProfileError, match="no metric table"):
        launch_metrics("==ERROR== unknown metric\n")
