"""The next GPU session's plan (lab/notes/next-gpu-run.toml, run by python -m lab.runs.session) checked here, so that no
typo costs device time: every job's `after` names a job started before it, the plan page names every job, every lab
program it calls accepts its arguments (run on a stage that needs no GPU: report or --dry-run), and the runner starts,
waits for and packs a small plan end to end."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from lab.runs import session
from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]
PLAN = REPO / "lab" / "notes" / "next-gpu-run.toml"
STAGES = {"gpu-multidevice": {"models", "rpccheck", "grid", "inprocess", "ubsweep", "report", "all"},
          "gpu-cotenancy": {"models", "rows", "ncu", "report", "all"}, "gpu-steps": {"steps"}}


def plan(work: Path = Path("/tmp/dec"), pkg: Path | None = None) -> dict:
    return session.load(PLAN, {"GPU_LAB_WORK": str(work), "GPU_LAB_PKG": str(pkg or work / "pkg")})


def lab_calls(run: str) -> list[list[str]]:
    """The lab programs (python3 -m lab.X ARGS, as [module, args...]) in one job's command."""
    words = shlex.split(run) + [";"]
    starts = [i + 2 for i, w in enumerate(words) if w == "python3" and words[i + 1] == "-m" and words[i + 2].startswith("lab.")]
    return [words[i:next(j for j in range(i, len(words)) if words[j] in (";", "&&", "python3"))] for i in starts]


def name_of(module: str) -> str:
    return module.rsplit(".", 1)[-1].replace("_", "-")


def option(call: list[str], name: str) -> str:
    return call[call.index(name) + 1]


def test_the_plan_is_valid_and_the_page_names_every_job() -> None:
    calls = plan()["calls"]
    notes = (REPO / "lab" / "notes" / "next-gpu-run.md").read_text()
    assert {"call1", "call2", "call3"} <= set(calls)
    for call, spec in calls.items():
        assert f"`{call}`" in notes and spec["wait"] <= 570  # a device call is 600 s at most
        jobs = [j["name"] for j in spec["jobs"]]
        for job in spec["jobs"]:
            assert f"`{job['name']}`" in notes, f"lab/notes/next-gpu-run.md does not name {call}'s job {job['name']}"
            assert set(job.get("after", [])) <= set(jobs[:jobs.index(job["name"])]) and job["time"] > 0
        build = lab_calls(spec["jobs"][0]["run"])[0]  # each call starts with the package's build, sm_90 SASS
        # a call that carries an earlier call's parts unpacks them; one without builds the series as it stands
        assert name_of(build[0]) == "gpu-package" and "--sass90" in build and ("--from" in build) == (".prior" in spec["carry"])
        columns = []
        for job in spec["jobs"]:
            for c in lab_calls(job["run"]):  # the measuring jobs run that build under a dispatch they name
                if name_of(c[0]) in STAGES and c[-1] != "models":
                    assert option(c, "--site") == option(build, "--site") and "--dispatch-shim" in c
                    columns += option(c, "--ncu-columns" if c[-1] == "ncu" else "--columns").split(",")
        assert set(columns) <= {"pyllm@a100", "pyllm"} and columns[0] == "pyllm@a100"  # the A100 dispatch first
    # the shipped series, and at most a lab probe beside it (switches that are off unless a job sets them)
    assert all("probe" in name for name in re.findall(r"lab/patches/(\S+)", PLAN.read_text()))


def test_a_plan_that_waits_for_a_later_job_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text('[calls.c]\njobs = [{name = "a", after = ["b"], run = "true"}, {name = "b", run = "true"}]\n')
    with pytest.raises(session.PlanError, match="a waits for b"):
        session.load(bad)
    result = fakes.program("lab.runs.session", str(bad), "c", "--dry-run", timeout=60)
    assert result.returncode == 2 and "a waits for b" in result.stderr


def test_dry_run_prints_the_queue_with_its_timeline() -> None:
    result = fakes.program("lab.runs.session", str(PLAN), "call1", "--dry-run", timeout=60)
    assert result.returncode == 0, result.stderr
    lines = [shlex.split(line) for line in result.stdout.splitlines() if not line.startswith("#")]
    assert [w[:3] for w in lines[:2]] == [["lab/scripts/gpu-session", "start", "bpkg1"], ["lab/scripts/gpu-session", "start", "models1"]]
    assert lines[3][:4] == ["lab/scripts/gpu-session", "after", "cot", "bpkg1,models1"] and lines[3][4:6] == ["bash", "-c"]
    assert "# cot: ~300-520 s" in result.stdout and "# 4 of 4 jobs end within the wait" in result.stdout


def test_every_lab_program_in_the_plan_accepts_its_arguments(tmp_path: Path) -> None:
    import pyllm_a100

    site = Path(pyllm_a100.__file__).resolve().parents[1]  # the installed package stands for gpu-package's --site
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    calls = {tuple(c) for spec in plan(tmp_path / "w", site)["calls"].values() for j in spec["jobs"] for c in lab_calls(j["run"])}
    assert {name_of(c[0]) for c in calls} == {"gpu-package", "gpu-multidevice", "gpu-cotenancy", "gpu-steps"}
    for call in sorted(calls):
        name, args = name_of(call[0]), list(call[1:])
        if name == "gpu-package":
            args, want = [*args, "--dry-run"], 0
        else:
            while args and args[-1] in STAGES[name]:
                args.pop()
            args, want = [*args, "report"], None  # any code but argparse's 2 (the report of nothing may say it failed)
        result = subprocess.run([sys.executable, "-m", call[0], *args], capture_output=True, text=True, env=env,
                                timeout=300, cwd=REPO)
        assert "usage:" not in result.stderr and "Traceback" not in result.stderr, (call, result.stderr[-2000:])
        assert want is None or result.returncode == want, (call, result.stdout[-1000:], result.stderr[-1000:])


def test_the_runner_sets_up_starts_waits_and_packs(tmp_path: Path) -> None:
    """A small plan through lab/scripts/gpu-session: the setup's environment reaches the jobs, a job after another
    sees its output, $OUT gets the plan's files and the logs (a big one cut)."""
    (tmp_path / "env.sh").write_text('export GREETING="hello there"\n')
    (tmp_path / "plan.toml").write_text(f'''[vars]
R = "${{W}}/results"
[setup]
env = "{tmp_path / 'env.sh'}"
run = ["mkdir -p ${{R}}", "echo '{{}}' > ${{R}}/gpu-x.json"]
[pack]
files = ["${{R}}/gpu-*.json"]
logs = ["${{W}}/*.log"]
[calls.one]
wait = 60
jobs = [{{name = "a", time = 1, run = "echo $GREETING > $OUT/a.txt"}},
        {{name = "b", after = ["a"], time = 1, run = "cat $JOB_OUT/../a/a.txt; head -c 3000000 /dev/zero > ${{W}}/big.log"}}]
''')
    out = tmp_path / "out"
    out.mkdir()
    env = dict(fakes.env_without_preload(), OUT=str(out), GPU_LAB_WORK=str(tmp_path / "w"),
               GPU_SESSION_ROOT=str(tmp_path / "s"))
    result = fakes.program("lab.runs.session", str(tmp_path / "plan.toml"), "one", env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "gpu-x.json").read_text() == "{}\n" and (tmp_path / "s" / "out" / "a" / "a.txt").read_text() == "hello there\n"
    assert "== b: ended rc=0" in result.stdout and "hello there" in (tmp_path / "s" / "b.log").read_text()
    with tarfile.open(out / "lab-logs.tgz") as tar:
        sizes = {m.name: m.size for m in tar.getmembers()}
    assert sizes["gpu-session/a.rc"] == 2 and next(s for n, s in sizes.items() if n.endswith("big.log")) < 600_000


def test_prepare_carry_documents_itself_and_refuses_unknown_arguments(tmp_path: Path) -> None:
    script = REPO / "lab" / "scripts" / "prepare-carry"
    ok = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "gguf 0.19.0" in ok.stdout and ".m1/smol6.gguf" in ok.stdout
    bad = subprocess.run(["bash", str(script), "--nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
    empty = subprocess.run(["bash", str(script), "--prior", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert empty.returncode == 1 and "holds no pkg-build.tar.xz.NN" in empty.stderr  # refused before .prior is touched
    assert os.access(script, os.X_OK) and os.access(REPO / "lab" / "scripts" / "gpu-session", os.X_OK)
