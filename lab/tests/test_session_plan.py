"""The next GPU session's commands (lab/scripts/gpu-lab-session, lab/notes/next-gpu-run.md) checked here, so that no
typo costs device time: every queued job's dependencies exist and come first, and every lab script it calls accepts its
arguments (run on a stage that needs no GPU: report, --dry-run, or a missing-binary error past argument parsing)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "lab" / "scripts" / "gpu-lab-session"
STAGES = {"gpu-a100-check": {"ops", "soak", "tokens", "sanitizer", "report", "all"},
          "gpu-multitoken": {"models", "warmup", "verify", "batched", "draft", "probe", "ncu", "report", "all"},
          "gpu-decode": {"build", "models", "ops", "bench", "batched", "ncu", "ncufull", "report", "all"},
          "gpu-multidevice": {"models", "rpccheck", "grid", "inprocess", "ubsweep", "report", "all"},
          "gpu-cotenancy": {"models", "rows", "ncu", "report", "all"}}


def queued(work: Path, call: str = "call1", pkg: Path | None = None) -> list[list[str]]:
    env = dict(fakes.env_without_preload(), GPU_LAB_DRY_RUN="1", GPU_LAB_WORK=str(work), GPU_LAB_PKG=str(pkg or work / "pkg"))
    out = subprocess.run(["bash", str(SESSION), call], capture_output=True, text=True, env=env, timeout=60, check=True).stdout
    return [shlex.split(line) for line in out.splitlines() if line.strip()]


def name_of(module: str) -> str:
    """A lab program's name from its module: lab.runs.gpu_build -> gpu-build."""
    return module.rsplit(".", 1)[-1].replace("_", "-")


def python_commands(job: list[str]) -> list[list[str]]:
    """The lab programs' invocations (python3 -m lab.X, as [module, args...]) inside one job (bash -c strings split at ; and &&, OUT=... assignments dropped)."""
    cmd = job[job.index("start") + 2:] if "start" in job else job[job.index("after") + 3:]
    if cmd[:2] == ["bash", "-c"]:  # split at ; and && outside quotes (a --probe value holds ; in its quotes)
        lex = shlex.shlex(cmd[2].replace("\\\n", " "), posix=True, punctuation_chars=";&")
        lex.whitespace_split = True
        pieces, words = [], []
        for word in lex:
            if word in (";", "&&"):
                pieces.append(words)
                words = []
            else:
                words.append(word)
        pieces.append(words)
    else:
        pieces = [cmd]
    out = []
    for words in pieces:
        while words and (re.fullmatch(r"[A-Z_]+=.*", words[0]) or words[0] in ("nice", "-n") or words[0].isdigit()):
            words = words[1:]
        if words[:2] == ["python3", "-m"] and words[2].startswith("lab."):
            out.append(words[2:])
    return out


CALLS = {  # each call's jobs in order, and what each waits for
    "call1": {"bpkg1": "", "models1": "", "packbuild": "bpkg1", "cot": "bpkg1,models1", "cot2": "cot", "cotglm": "cot2",
              "ncu": "cotglm"},
    "call2": {"bpkg2": "", "models2": "", "models2b": "models2", "rpccheck": "bpkg2", "mdv4": "rpccheck,models2",
              "inproc": "mdv4", "mdmore": "inproc,models2b", "mdnat": "mdmore", "ub": "mdnat"},
    "call3": {"bpkg3": "", "models3": "", "rpccheck3": "bpkg3", "cot2": "bpkg3,models3,rpccheck3", "cotglm": "cot2",
              "ncu": "cotglm", "mdnat": "ncu", "ub": "mdnat"},
}


def stage_calls(jobs: list[list[str]]) -> dict[str, list[str]]:
    """Each job's one lab program call (module and arguments)."""
    out = {}
    for job in jobs:
        (call,) = python_commands(job)
        out[job[2]] = call
    return out


def option(call: list[str], name: str) -> str:
    return call[call.index(name) + 1]


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_job_depends_on_jobs_queued_before_it(call: str, tmp_path: Path) -> None:
    jobs = queued(tmp_path / "w", call)
    seen: list[str] = []
    for job in jobs:
        assert job[0] == "lab/scripts/gpu-session" and job[1] in ("start", "after"), job
        name = job[2]
        if job[1] == "after":
            assert set(job[3].split(",")) <= set(seen), f"{name} waits for {job[3]}, queued: {seen}"
        seen.append(name)
    # the build and the models beside it, then every GPU job one after the other, alone on the GPU
    assert {j[2]: (j[3] if j[1] == "after" else "") for j in jobs} == CALLS[call] and seen == list(CALLS[call])
    text = "\n".join(shlex.join(j) for j in jobs)
    assert "lab/patches" not in text  # the shipped series only (the package's own build applies vendor/patches)
    calls = stage_calls(jobs)
    build = calls[seen[0]]
    assert name_of(build[0]) == "gpu-package" and "--sass90" in build and "--pack-to" not in build
    assert ("--from" in build) == (call != "call1")
    if call == "call1":  # the same build packed for the next call (the same arguments find it installed and keep it)
        packing = calls["packbuild"]
        assert packing[:len(build)] == build and "--pack-to" in packing
    for name, c in calls.items():  # every measuring job runs the package's build under a dispatch it names
        if name_of(c[0]) in ("gpu-cotenancy", "gpu-multidevice") and c[-1] != "models":
            assert option(c, "--site") == option(build, "--site") and "--dispatch-shim" in c
            columns = option(c, "--ncu-columns" if c[-1] == "ncu" else "--columns").split(",")
            assert set(columns) <= {"pyllm@a100", "pyllm"}


def test_the_a100_dispatch_comes_first_and_the_issues_settings_are_all_queued(tmp_path: Path) -> None:
    one, two = stage_calls(queued(tmp_path / "w")), stage_calls(queued(tmp_path / "w", "call2"))
    cot = one["cot"]
    assert option(cot, "--columns") == "pyllm@a100,pyllm" and option(cot, "--models") == "v4-43l"
    assert option(cot, "--settings") == "baseline,defaults" and option(one["cot2"], "--settings") == "target50,target100"
    assert option(one["cotglm"], "--models") == "glm5-12l" and one["ncu"][-1] == "ncu"
    written = {m for j in ("models1",) for m in option(one[j], "--models").split(",")}
    assert {"v4-43l", "glm5-12l"} <= written
    assert option(two["rpccheck"], "--columns") == "pyllm@a100,pyllm" and two["rpccheck"][-1] == "rpccheck"
    grid = [two[j] for j in ("mdv4", "mdmore", "mdnat")]
    assert {m for g in grid for m in option(g, "--models").split(",")} == {"v4-43l", "glm5-12l", "v32-16l"}
    assert all(sorted(map(int, option(g, "--devices").split(","))) == [1, 2, 4, 8] for g in grid)
    assert [option(g, "--columns") for g in grid] == ["pyllm@a100", "pyllm@a100", "pyllm"]
    assert option(two["inproc"], "--inprocess-devices") == "8" and option(two["ub"], "--ub").startswith("12,")
    written = {m for j in ("models2", "models2b") for m in option(two[j], "--models").split(",")}
    assert written == {"v4-43l", "glm5-12l", "v32-16l"}


def test_the_plans_models_are_the_shapes_the_issues_name() -> None:
    from lab.bench.lab_models import MODELS
    from pyllm_a100.synth.presets import PRESETS, hparams_for

    preset, layers, experts, _ = MODELS["glm5-12l"]
    h = hparams_for(preset, experts)  # refuses an expert count the preset cannot take
    assert (preset, h["n_expert"]) == ("glm-5", 16)
    assert layers >= 3 * h["leading_dense"]  # MoE layers outnumber the leading dense ones, as in the 78-layer model
    assert MODELS["v4-43l"][:3] == ("deepseek-v4-flash", 43, 16)
    preset, layers, _, _ = MODELS["v32-16l"]
    assert PRESETS[preset].family == "deepseek32" and layers >= 8  # every one of 8 devices holds a layer


def test_the_notes_describe_every_queued_job(tmp_path: Path) -> None:
    notes = (REPO / "lab" / "notes" / "next-gpu-run.md").read_text()
    for call in CALLS:
        assert f"`{call}`" in notes
        for job in CALLS[call]:
            assert f"`{job}`" in notes, f"lab/notes/next-gpu-run.md does not name {call}'s job {job}"


def test_every_lab_script_in_the_plan_accepts_its_arguments(tmp_path: Path) -> None:
    import pyllm_a100

    work = tmp_path / "w"
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    site = Path(pyllm_a100.__file__).resolve().parents[1]  # the installed package stands for gpu-package's --site
    calls = [c for call in CALLS for job in queued(work, call, site) for c in python_commands(job)]
    assert {name_of(c[0]) for c in calls} == {"gpu-package", "gpu-multidevice", "gpu-cotenancy"}
    for call in calls:
        name, args = name_of(call[0]), call[1:]
        if name in ("gpu-build", "gpu-package"):
            args = [*args, "--dry-run"]
            want = 0
        elif name in STAGES:
            while args and args[-1] in STAGES[name]:
                args = args[:-1]
            args = [*args, "report"]
            want = None  # any code but argparse's 2 (the report of nothing may say it failed)
        elif name == "gpu-concurrency":  # past parsing: no build in the work folder (the shim is there, empty)
            work.mkdir(parents=True, exist_ok=True)
            (work / "a100-dispatch.so").touch()
            want = 1
        elif name == "gpu-draft-soak":  # past parsing: no llama-server in the (missing) work folder
            want = 1
        elif name in ("gpu-ab-table", "gpu-token-check"):  # past parsing: no stage files in the (missing) folder
            want = 2
        else:  # gpu-kld: past parsing it finds no binaries in the (empty) work folder
            want = 2
        result = subprocess.run([sys.executable, "-m", call[0], *args], capture_output=True, text=True, env=env,
                                timeout=300, cwd=REPO)
        if name in ("gpu-ab-table", "gpu-token-check"):  # their only refusal here: the missing folder, options parsed
            assert result.returncode == 2 and any(w in result.stderr for w in ("no such folder", "no build", "holds none of")), result.stderr
            continue
        assert "usage:" not in result.stderr and "Traceback" not in result.stderr, (call, result.stderr[-2000:])
        if want is not None:
            assert result.returncode == want, (call, result.stdout[-1000:], result.stderr[-1000:])
        if name == "gpu-kld":
            assert "no executable" in result.stderr
        if name == "gpu-draft-soak":
            assert "cand-bin/llama-server is missing" in result.stderr
        if name == "gpu-concurrency":
            assert "patched-bin/llama-server" in result.stdout + result.stderr


def test_prepare_carry_documents_itself_and_refuses_unknown_arguments(tmp_path: Path) -> None:
    script = REPO / "lab" / "scripts" / "prepare-carry"
    ok = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "gguf 0.19.0" in ok.stdout and ".m1/smol6.gguf" in ok.stdout
    bad = subprocess.run(["bash", str(script), "--nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
    empty = subprocess.run(["bash", str(script), "--prior", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert empty.returncode == 1 and "holds no pkg-build.tar.xz.NN" in empty.stderr  # refused before .prior is touched
    assert subprocess.run(["bash", "-n", str(SESSION)], timeout=60).returncode == 0
    assert os.access(SESSION, os.X_OK) and os.access(script, os.X_OK)
