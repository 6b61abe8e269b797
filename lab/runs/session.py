"""One device call of a GPU session, read from a plan file: its jobs started detached with lab/scripts/gpu-session (they
outlive the call, so builds and models survive into the next one), a wait of at most the call's budget, then the
results and logs packed into $OUT.

    python -m lab.runs.session lab/notes/next-gpu-run.toml call1            # on the GPU machine, as a device call
    python -m lab.runs.session lab/notes/next-gpu-run.toml call1 --dry-run  # here: the queue, its timeline, the budget
    python -m lab.runs.session lab/notes/next-gpu-run.toml --pack           # a later call on a machine still warm

The plan (TOML):
  [vars]        NAME = "text", ${NAME} in later vars and in every command; W (GPU_LAB_WORK, default /tmp/dec), PKG
                (GPU_LAB_PKG, /tmp/pkg) and SHIM (W/a100-dispatch.so) are given
  [setup]       env: a shell script sourced first (its exports reach every job); run: commands run in order before the
                jobs, the call stops at the first that fails (end one with `|| true` to go on)
  [pack]        files: globs copied into $OUT; logs: globs packed with the jobs' folder (gpu-session's, no .gguf) into
                $OUT/lab-logs.tgz,
                a file over 1 MiB cut to its first and last 256 KiB
  [calls.NAME]  wait: seconds (GPU_LAB_WAIT overrides); carry: the ignored folders the device call carries (printed);
                jobs: [{name, run, after = [names], time = seconds}] in the order they start
Each job runs as ``bash -c RUN`` with OUT set to its own folder (gpu-session's JOB_OUT); a job with ``after`` starts
when those jobs have ended, whatever their exit codes. Standard library only (the GPU machine has no package index).
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from string import Template

REPO = Path(__file__).resolve().parents[2]
SESSION = "lab/scripts/gpu-session"
CUT = 1 << 20  # logs over this are cut to their first and last quarter MiB


class PlanError(ValueError):
    pass


def load(path: str | os.PathLike[str], env: dict[str, str] | None = None) -> dict:
    """The plan with every ${NAME} replaced; PlanError for a job without a name or command, a name used twice in a call,
    or an ``after`` that names no job started before it."""
    env = os.environ if env is None else env
    plan = tomllib.loads(Path(path).read_text())
    w = env.get("GPU_LAB_WORK", "/tmp/dec")
    names = {"W": w, "PKG": env.get("GPU_LAB_PKG", "/tmp/pkg"), "SHIM": f"{w}/a100-dispatch.so"}
    for key, value in plan.get("vars", {}).items():
        names[key] = Template(value).safe_substitute(names)

    def sub(value):
        if isinstance(value, str):
            return Template(value).safe_substitute(names)
        if isinstance(value, list):
            return [sub(v) for v in value]
        return {k: sub(v) for k, v in value.items()} if isinstance(value, dict) else value

    plan = {k: sub(v) for k, v in plan.items() if k != "vars"} | {"vars": names}
    for call, spec in plan.get("calls", {}).items():
        seen: list[str] = []
        for job in spec.get("jobs", []):
            if not job.get("name") or not job.get("run") or job["name"] in seen:
                raise PlanError(f"{call}: every job needs a name of its own and a run command: {job}")
            missing = [a for a in job.get("after", []) if a not in seen]
            if missing:
                raise PlanError(f"{call}: {job['name']} waits for {', '.join(missing)}, not started before it")
            seen.append(job["name"])
    return plan


def commands(spec: dict) -> list[list[str]]:
    """The gpu-session invocations that start a call's jobs, in order."""
    out = []
    for job in spec["jobs"]:
        how = ["after", job["name"], ",".join(job["after"])] if job.get("after") else ["start", job["name"]]
        out.append([SESSION, *how, "bash", "-c", f"export OUT=$JOB_OUT; {job['run']}"])
    return out


def timeline(spec: dict) -> dict[str, tuple[int, int]]:
    """Each job's estimated start and end in seconds (jobs without ``after`` start at once, side by side)."""
    ends: dict[str, tuple[int, int]] = {}
    for job in spec["jobs"]:
        start = max((ends[a][1] for a in job.get("after", [])), default=0)
        ends[job["name"]] = (start, start + int(job.get("time", 0)))
    return ends


def dry_run(plan: dict, call: str, wait: int) -> None:
    spec = plan["calls"][call]
    times = timeline(spec)
    print(f"# {call}: carry {spec.get('carry', [])}, wait {wait} s")
    for job, argv in zip(spec["jobs"], commands(spec)):
        start, end = times[job["name"]]
        print(f"# {job['name']}: ~{start}-{end} s{'' if end <= wait else '  (past the wait: cut)'}")
        print(shlex.join(argv))
    done = sum(end <= wait for _, end in times.values())
    print(f"# {done} of {len(times)} jobs end within the wait ({max(e for _, e in times.values())} s in all)")


def sh(command: str) -> int:
    print(f"$ {command}", flush=True)
    return subprocess.run(["bash", "-c", command]).returncode


def setup(plan: dict) -> None:
    spec = plan.get("setup", {})
    if spec.get("env"):  # the script's exports, into this process and so into every job
        out = subprocess.run(["bash", "-c", '. "$1" >&2 && env -0', "_", spec["env"]], capture_output=True, check=True)
        os.environ.update(line.split("=", 1) for line in out.stdout.decode().split("\0") if "=" in line)
    for command in spec.get("run", []):
        if sh(command):
            raise SystemExit(f"session: setup failed: {command}")


def pack(plan: dict, out: Path) -> None:
    spec = plan.get("pack", {})
    for pattern in spec.get("files", []):
        for f in sorted(glob.glob(pattern)):
            shutil.copy(f, out)
    with tarfile.open(out / "lab-logs.tgz", "w:gz") as tar:
        for pattern in spec.get("logs", []):
            for f in sorted(glob.glob(pattern)):
                size = os.path.getsize(f)
                if size <= CUT:
                    tar.add(f)
                    continue
                with open(f, "rb") as src:
                    data = src.read(CUT // 4) + b"\n[... cut ...]\n"
                    src.seek(size - CUT // 4)
                    data += src.read()
                info = tarfile.TarInfo(f.lstrip("/"))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        root = os.environ.get("GPU_SESSION_ROOT", "/tmp/gpu-session")  # the jobs' logs, exit codes and out/ folders
        if os.path.isdir(root):
            tar.add(root, arcname="gpu-session", filter=lambda t: None if t.name.endswith(".gguf") else t)
    for f in sorted(out.iterdir()):
        print(f"{f.stat().st_size:>12} {f.name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", type=Path)
    ap.add_argument("call", nargs="?", help="the call to run (omit with --pack)")
    ap.add_argument("--dry-run", action="store_true", help="print the queue and its timeline; run nothing")
    ap.add_argument("--pack", action="store_true", help="wait GPU_LAB_WAIT (30 s) for running jobs, then pack")
    a = ap.parse_args()
    try:
        plan = load(a.plan)
    except (OSError, tomllib.TOMLDecodeError, PlanError) as e:
        ap.error(str(e))
    calls = plan.get("calls", {})
    if not a.pack and a.call not in calls:
        ap.error(f"name a call: {', '.join(calls)} (or --pack)")
    wait = int(os.environ.get("GPU_LAB_WAIT") or (30 if a.pack else calls[a.call].get("wait", 560)))
    if a.dry_run:
        dry_run(plan, a.call, wait)
        return 0
    out = Path(os.environ.get("OUT") or "")
    if not os.environ.get("OUT") or not out.is_dir():
        ap.error("$OUT must name the folder that comes back")
    os.chdir(REPO)
    if not a.pack:
        setup(plan)
        for argv in commands(calls[a.call]):
            subprocess.run(argv, check=True)
    subprocess.run([SESSION, "wait", str(wait)], env={k: v for k, v in os.environ.items() if k != "OUT"})
    pack(plan, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
