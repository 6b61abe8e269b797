"""Issue 41's re-verification plan (lab/runs/gpu_a100_check.py, lab/bench/a100check.py) on the CPU: test-backend-ops
output parsing, FLASH_ATTN_EXT's parts, the ops stage end to end over a stand-in test-backend-ops (timeouts, failures,
not-supported and not-run counts, the dispatch proof), the sanitizer stage over stand-ins, and the crash sweep through
this package's real CPU llama-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import a100check as ac
from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]
G, R, Z = "\x1b[1;32m", "\x1b[1;31m", "\x1b[0m"

SUPPORT = f"""Testing 2 devices

Backend 1/2: CUDA0
  Device description: NVIDIA H200
  MUL_MAT(type_a=f16,type_b=f32,m=16,n=1,k=256): {G}SUPPORTED{Z}
  MUL_MAT(type_a=iq1_m,type_b=f32,m=16,n=1,k=256): {R}NOT SUPPORTED{Z}
  FLASH_ATTN_EXT(hsk=64,hsv=64,nh=4,nr23=[1,1],kv=512,nb=1): {G}SUPPORTED{Z}
  FLASH_ATTN_EXT(hsk=576,hsv=512,nh=1,nr23=[20,1],kv=1024,nb=75): {G}SUPPORTED{Z}
  FLASH_ATTN_EXT(hsk=65,hsv=67,nh=4,nr23=[1,1],kv=113,nb=75): {G}SUPPORTED{Z}
  FLASH_ATTN_EXT(hsk=640,hsv=640,nh=4,nr23=[1,1],kv=113,nb=75): {G}SUPPORTED{Z}
  MUL_MAT_VEC_FUSION(type=q4_0,n=1): {G}SUPPORTED{Z}
  Backend CUDA0: {G}OK{Z}
"""


def test_support_listing_gives_every_case_by_op() -> None:
    cases = ac.support_cases(SUPPORT)
    assert list(cases) == ["MUL_MAT", "FLASH_ATTN_EXT", "MUL_MAT_VEC_FUSION"]
    assert cases["MUL_MAT"] == [("type_a=f16,type_b=f32,m=16,n=1,k=256", True), ("type_a=iq1_m,type_b=f32,m=16,n=1,k=256", False)]
    assert len(cases["FLASH_ATTN_EXT"]) == 4


def test_fa_parts_are_disjoint_and_take_every_case() -> None:
    parts = ac.fa_parts()
    assert parts["hsk=64"] == "^hsk=64," and len(parts) == len(ac.FA_HEAD_SIZES) + 1
    for params, want in [("hsk=64,hsv=64", "hsk=64"), ("hsk=576,hsv=512", "hsk=576"), ("hsk=65,hsv=67", "hsk=other"),
                         ("hsk=640,hsv=640", "hsk=other"), ("hsk=40,hsv=40", "hsk=40")]:
        assert [n for n, rx in parts.items() if __import__("re").search(rx, params)] == [want], params


def test_jobs_by_name_group_and_fa_part_biggest_first() -> None:
    jobs = ac.jobs(ac.support_cases(SUPPORT))
    fa = [(j["part"], j["cases"], j["supported"]) for j in jobs if j["op"] == ac.FA]
    assert sorted(fa) == [("hsk=576", 1, 1), ("hsk=64", 1, 1), ("hsk=other", 2, 2)]
    named = [j for j in jobs if j["op"] is None]
    assert sum(len(j["listed"]) for j in named) == 2 and {n for j in named for n in j["listed"]} == {"MUL_MAT", "MUL_MAT_VEC_FUSION"}
    assert jobs[0]["supported"] == max(j["supported"] for j in jobs)
    only = ac.jobs(ac.support_cases(SUPPORT), only=["MUL_MAT", "DSV4_HC_CHAIN"])
    assert [(j["filter"], j["listed"]) for j in only] == [("MUL_MAT", {"MUL_MAT": (2, 1)}), ("DSV4_HC_CHAIN", {"DSV4_HC_CHAIN": (0, 0)})]
    assert all(j["op"] == ac.FA for j in ac.jobs(ac.support_cases(SUPPORT), only=[ac.FA]))


NAMES = ["ABS", "ADD", "ADD_ID", "CONV_2D", "CONV_2D_DW", "FILL", "FLOOR", "GELU", "MUL", "MUL_MAT", "MUL_MAT_ID",
         "MUL_MAT_VEC_FUSION", "SOFT_MAX", "X9", "_ODD"]


@pytest.mark.parametrize("max_cases", [1, 3, 1000])
def test_name_groups_take_every_name_once_and_flash_attention_never(max_cases: int) -> None:
    """test-backend-ops's -o reads an entry with "(" as a whole case string and splits at ",": the groups' regexes
    hold neither, and still every name (listed, fusion tests nobody listed, odd ones) falls in exactly one."""
    import re

    weights = {n: (5 if n.startswith("MUL_MAT") else 1) for n in NAMES}
    groups = ac.name_groups(weights, max_cases=max_cases)
    assert not any("(" in rx or "," in rx for rx in groups.values())
    for name in [*NAMES, "DSV4_HC_CHAIN", "MUL_MAT_ID_FUSION", "FLASH_ATTN_EXTRA", "FLASH", "F", "FALCON", "Q", "9X", ""]:
        assert sum(bool(re.search(rx, name)) for rx in groups.values()) == 1, (name, groups)
    assert not any(re.search(rx, ac.FA) for rx in groups.values())
    if max_cases == 1000:
        assert len(groups) == 1  # everything fits one process
    sizes = [sum(w for n, w in weights.items() if re.search(rx, n)) for rx in groups.values()]
    assert max(sizes) <= max(max_cases, 5)


def test_a_group_process_is_counted_per_test_name_from_its_lines() -> None:
    job = {"op": None, "part": "M*", "listed": {"MUL_MAT": (3, 3), "MUL": (2, 2)}, "supported": 5}
    out = (f"  MUL_MAT(a=1): {G}OK{Z}\n  MUL_MAT(a=2): [MUL_MAT] NMSE = 1 > 0.0005 {R}FAIL{Z}\n  MUL_MAT(a=3): {G}OK{Z}\n"
           f"  MUL_MAT_VEC_FUSION(n=1): {G}OK{Z}\n  MUL(x=1): not supported [CUDA0] \n  MUL(x=2): {G}OK{Z}\n"
           f"  4/5 tests passed\n\nFailing tests:\n  MUL_MAT(a=2)\n")
    rows = {r["op"]: r for r in ac.split_names(out, 1, job)}
    assert (rows["MUL_MAT"]["passed"], rows["MUL_MAT"]["failed"], rows["MUL_MAT"]["failed_tests"]) == (2, 1, ["MUL_MAT(a=2)"])
    assert (rows["MUL"]["cases"], rows["MUL"]["not_supported"], rows["MUL"]["supported"]) == (2, 1, 2)
    assert rows["MUL_MAT_VEC_FUSION"]["cases"] == 1 and all(r["finished"] for r in rows.values())  # a fusion test
    cut = ac.split_names(f"  MUL_MAT(a=1): {G}OK{Z}\n", "timeout", job)
    assert {r["op"]: (r["passed"], r["not_run"], r["finished"]) for r in cut} == {"MUL": (0, 2, False), "MUL_MAT": (1, 2, False)}


def test_counts_from_the_summary_and_from_the_statuses_after_a_timeout() -> None:
    job = {"op": "ADD", "part": None, "cases": 4, "supported": 3}
    done = (f"  ADD(a): {G}OK{Z}\n  ADD(b): [ADD] NMSE = 0.1 > 1e-07 {R}FAIL{Z}\n  ADD(c): {G}OK{Z}\n  ADD(d): not supported [CUDA0] \n"
            f"  2/3 tests passed\n\nFailing tests:\n  ADD(b)\n  Backend CUDA0: {R}FAIL{Z}\n")
    c = ac.count(done, 1, job)
    assert (c["passed"], c["failed"], c["not_supported"], c["not_run"], c["finished"]) == (2, 1, 1, 0, True)
    assert c["failed_tests"] == ["ADD(b)"]
    cut = f"  ADD(a): {G}OK{Z}\n  ADD(b): [ADD] NMSE = 0.1 > 1e-07 {R}FAIL{Z}\n"
    c = ac.count(cut, "timeout", job)
    assert (c["passed"], c["failed"], c["not_run"], c["finished"], c["failed_tests"]) == (1, 1, 1, False, ["ADD(b)"])
    t = ac.totals([c, dict(ac.count(done, 1, job), op="MUL")])
    assert t["passed"] == 3 and t["not_run"] == 1 and t["unfinished"] == ["ADD"] and t["failing_ops"] == ["ADD", "MUL"]


def test_sanitizer_summaries() -> None:
    assert ac.memcheck_summary("========= ERROR SUMMARY: 0 errors\n") == {"errors": 0, "finished": True, "first_errors": []}
    race = ac.memcheck_summary("========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n")
    assert (race["hazards"], race["errors"], race["warnings"]) == (3, 1, 2)
    assert ac.memcheck_summary("killed")["finished"] is False


def run(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return fakes.program("lab.runs.gpu_a100_check", *args, env=env, timeout=timeout)


@pytest.mark.parametrize("args,message", [(["--builds", "pin@h100"], "DISPATCH one of"), (["--parallel", "0"], "--parallel"),
                                          (["--ub", "-1"], "--ub"), (["--ub-values", "4,4"], "--ub-values"),
                                          (["--ub-values", "0,64"], "--ub-values")])
def test_bad_arguments_are_one_usage_error(args: list[str], message: str, tmp_path: Path) -> None:
    result = run("--work", str(tmp_path), *args, "report")
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_ops_and_sanitizer_stages_over_stand_ins(tmp_path: Path) -> None:
    """Both builds under the A100 dispatch (the default): every listed op run, FLASH_ATTN_EXT in parts, the hsk=576
    part cut by its 3 s timeout (its case counted as not run), ADD's failing case named; the capability 8.0 read back
    from each process; then the sanitizer stage over a compute-sanitizer stand-in, and the tokens stage over stand-in
    llama-servers; the report holds all three."""
    work = tmp_path / "work"
    fakes.builds(work)
    (work / "tiny-v4.gguf").write_bytes(b"GGUF")
    shim = fakes.dummy_shim(tmp_path / "shim")
    fakes.sanitizer(tmp_path / "tools")
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"), PATH=f"{tmp_path / 'tools'}{os.pathsep}{os.environ['PATH']}")
    result = run("--work", str(work), "--dispatch-shim", str(shim), "--part-timeout", "3", "--parallel", "4", "ops",
                 "sanitizer", "tokens", env=env)
    assert result.returncode == 1, result.stdout + result.stderr  # ADD fails and a part timed out: the stage says so
    assert "ops failed: RuntimeError: failing ADD; unfinished FLASH_ATTN_EXT[hsk=576]" in result.stdout
    data = json.loads((tmp_path / "out" / "gpu-a100-dispatch.json").read_text())
    builds = data["ops"]["builds"]
    assert set(builds) == {"pin@a100", "patched@a100"}
    for b in builds.values():
        assert b["reported_capability"] == "8.0" and b["capabilities_in_runs"] == ["8.0"] and not b["record"].get("problem")
        assert b["listed_ops"] == 3 and b["jobs"] == 4  # one name group (few cases) and three FA parts
        ops = b["ops"]
        assert ops["MY_FUSION"]["passed"] == 1  # a fusion test support mode did not list, found by its group
        assert ops["MUL_MAT"] | {} == {**ops["MUL_MAT"], "cases": 3, "passed": 2, "failed": 0, "not_supported": 1, "not_run": 0}
        assert ops["ADD"]["failed"] == 1 and ops["ADD"]["failed_tests"] == ["ADD(type=f16,ne=[10,5,4,3])"]
        fa = ops["FLASH_ATTN_EXT"]
        assert set(fa["parts"]) == {"hsk=64", "hsk=576", "hsk=other"}
        assert fa["parts"]["hsk=576"]["rc"] == "timeout" and fa["parts"]["hsk=576"]["not_run"] == 1
        assert (fa["passed"], fa["not_run"]) == (3, 1) and fa["unfinished"] == ["FLASH_ATTN_EXT[hsk=576]"]
        assert b["totals"]["failing_ops"] == ["ADD"] and b["totals"]["passed"] == 7 and b["totals"]["supported"] == 9
    assert data["parts"]["ops"]["command"].startswith("python -m lab.runs.gpu_a100_check --work") and data["parts"]["ops"]["ok"] is False
    runs = data["sanitizer"]["runs"]
    assert set(runs) == {"memcheck v4-4l -n 8", "racecheck v4-4l -n 2", "memcheck tiny-v4 -n 8", "racecheck tiny-v4 -n 2"}
    assert all(r["errors"] == 0 and r["finished"] and r["reported_capability"] == "8.0" for r in runs.values())
    assert "llama-completion" in runs["memcheck v4-4l -n 8"]["command"] and data["parts"]["sanitizer"]["ok"] is True
    tokens = data["tokens"]
    assert tokens["all_equal"] is True and tokens["reported_capability"]["patched@a100"] == "8.0"
    assert "lab.runs.gpu_token_check" in tokens["script"] and tokens["summary"]["patched@a100:v4-4l:p300"]["equal_to_native"] is False
    text = (tmp_path / "out" / "gpu-a100-dispatch.txt").read_text()
    assert "[ops] pin@a100: cc 8.0, 7/9 passed, 1 failed, 1 not supported, 1 not run; unfinished FLASH_ATTN_EXT[hsk=576]; failing ADD" in text


def test_crash_sweep_through_the_cpu_llama_server(tmp_path: Path) -> None:
    """The soak stage with this package's CPU llama-server standing for the patched build (native dispatch: no GPU):
    tiny-llama lengths 1..6 and the "4-layer V4" (here tiny DeepSeek-V4, UD mix), then -ub 3 and 1 (--ub-values in place
    of --ub's 1..N) at lengths 1..5; 0 crashes."""
    from pyllm_a100.llamacpp.native import native_dir
    from pyllm_a100.synth import synthesize

    work = tmp_path / "work"
    work.mkdir()
    (work / "patched-bin").symlink_to(native_dir())
    synthesize("tiny-deepseek4", work / "v4-4l.gguf", weight_type="ud-q8-k-xl", seed=42)
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"), PYLLM_NATIVE_DIR=str(native_dir()),
               PYLLM_HOME=str(tmp_path / "home"))
    result = run("--work", str(work), "--dispatch", "native", "--soak-models", "tiny-llama,deepseek-v4-flash-4l",
                 "--max-length", "6", "--ub", "2", "--ub-values", "3,1", "--ub-lengths", "5", "soak", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    soak = json.loads((tmp_path / "out" / "gpu-a100-dispatch.json").read_text())["soak"]
    assert [c["label"] for c in soak["cases"]] == ["tiny-llama lengths 1-6", "deepseek-v4-flash-4l lengths 1-6",
                                                  "deepseek-v4-flash-4l -ub 3", "deepseek-v4-flash-4l -ub 1"]
    assert soak["verdict"]["crashes"] == 0 and soak["verdict"]["http_errors"] == 0 and soak["verdict"]["failed_cases"] == []
    assert soak["cases"][0]["requests"] == 6 + 1 + 4 + 16 and soak["cases"][2]["phases"]["lengths"]["requests"] == 5
    assert all(c["dispatch"] == "native" and c["reported_capability"] is None for c in soak["cases"])  # a CPU build
    assert "--soak-build patched" in soak["command"] and "--ub-values 3,1" in soak["command"]
