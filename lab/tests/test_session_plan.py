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

from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / "lab" / "scripts" / "gpu-lab-session"
STAGES = {"gpu-a100-check": {"ops", "soak", "tokens", "sanitizer", "report", "all"},
          "gpu-multitoken": {"models", "warmup", "verify", "batched", "draft", "probe", "ncu", "report", "all"},
          "gpu-decode": {"build", "models", "ops", "bench", "batched", "ncu", "ncufull", "report", "all"}}


def queued(work: Path) -> list[list[str]]:
    env = dict(fakes.env_without_preload(), GPU_LAB_DRY_RUN="1", GPU_LAB_WORK=str(work))
    out = subprocess.run(["bash", str(SESSION), "call1"], capture_output=True, text=True, env=env, timeout=60, check=True).stdout
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
        while words and (re.fullmatch(r"[A-Z_]+=.*", words[0]) or words[0] in ("nice", "-n", "5")):
            words = words[1:]
        if words[:2] == ["python3", "-m"] and words[2].startswith("lab."):
            out.append(words[2:])
    return out


def test_every_job_depends_on_jobs_queued_before_it(tmp_path: Path) -> None:
    jobs = queued(tmp_path / "w")
    seen: list[str] = []
    for job in jobs:
        assert job[0] == "lab/scripts/gpu-session" and job[1] in ("start", "after"), job
        name = job[2]
        if job[1] == "after":
            assert set(job[3].split(",")) <= set(seen), f"{name} waits for {job[3]}, queued: {seen}"
        seen.append(name)
    # one call that builds what it measures; the timing jobs one after another, alone on the GPU
    assert seen == ["bpatched", "models", "verify", "batched"]
    assert {j[2]: j[3] for j in jobs if j[1] == "after"} == {"verify": "bpatched,models", "batched": "verify"}
    text = "\n".join(shlex.join(j) for j in jobs)
    assert "lab/patches" not in text  # the shipped series only
    build = next(j for j in jobs if j[2] == "bpatched")
    assert build[build.index("--patches") + 1] == "all" and "--sass90" in build
    calls = [c for j in jobs for c in python_commands(j) if name_of(c[0]) == "gpu-multitoken"]
    stage = {c[-1]: c for c in calls}
    assert set(stage) == {"models", "verify", "batched"}
    verify, batched = stage["verify"], stage["batched"]
    assert stage["models"][stage["models"].index("--write") + 1] == verify[verify.index("--models") + 1] == "v4-43l"
    assert batched[batched.index("--batched-model") + 1] == "v4-43l"
    assert stage["models"][stage["models"].index("--drafts") + 1] == ""  # no draft files: nothing here serves one
    assert int(verify[verify.index("--reps") + 1]) >= 5  # capture on an early repetition, replays after: a replay is the median
    assert verify[verify.index("--columns") + 1] == batched[batched.index("--columns") + 1] == "patched,patched@a100"
    assert {7, 8} <= {int(k) for k in verify[verify.index("--k") + 1].split(",")}  # the 7 -> 8 step
    assert 16 in [int(n) for n in batched[batched.index("--npl") + 1].split(",")]  # issue 42's 16 sequences


def test_the_plans_model_is_glm5_with_its_dense_and_moe_layers() -> None:
    from lab.runs import gpu_multitoken as mod
    from pyllm_a100.synth.presets import hparams_for

    preset, layers, experts = mod.MODELS["glm5-12l"]
    h = hparams_for(preset, experts)  # refuses an expert count the preset cannot take
    assert (preset, h["n_expert"]) == ("glm-5", 16)
    assert layers >= 3 * h["leading_dense"]  # MoE layers outnumber the leading dense ones, as in the 78-layer model


def test_every_lab_script_in_the_plan_accepts_its_arguments(tmp_path: Path) -> None:
    work = tmp_path / "w"
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    calls = [c for job in queued(work) for c in python_commands(job)]
    assert {name_of(c[0]) for c in calls} == {"gpu-build", "gpu-multitoken"}
    for call in calls:
        name, args = name_of(call[0]), call[1:]
        if name == "gpu-build":
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


def test_prepare_carry_documents_itself_and_refuses_unknown_arguments() -> None:
    script = REPO / "lab" / "scripts" / "prepare-carry"
    ok = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "gguf 0.19.0" in ok.stdout and ".m1/smol6.gguf" in ok.stdout
    bad = subprocess.run(["bash", str(script), "--nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
    assert subprocess.run(["bash", "-n", str(SESSION)], timeout=60).returncode == 0
    assert os.access(SESSION, os.X_OK) and os.access(script, os.X_OK)
