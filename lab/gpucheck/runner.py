"""The GPU check's bookkeeping: the results file (OUT/gpu-check.json), the step wrapper that records each step's
result or error and saves, the server-log folder, and the helpers every step uses."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout python -m lab.runs.gpu_check imports this package from (and builds)
LOGS = Path("/tmp/gpu-check-logs")  # server logs, packed into OUT/server-logs.tar.gz at the end
RESULTS: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "steps": {}}
OUT: Path


def start(out: Path) -> None:
    """Where gpu-check.json, the build logs and server-logs.tar.gz go (python -m lab.runs.gpu_check --out)."""
    global OUT
    OUT = out


def dispatch_record() -> dict:
    """This run's dispatch (lab/bench/dispatch.py: a100 when the shim is preloaded) and the compute capabilities the
    llama.cpp logs in LOGS reported (one value when they all agree)."""
    from lab.bench import dispatch as dsp

    seen = {}
    for log in sorted(LOGS.rglob("*.log")) if LOGS.is_dir() else []:
        cap = dsp.reported_capability(log.read_text(errors="replace"))
        if cap:
            seen.setdefault(cap, []).append(log.name)
    caps = sorted(seen)
    return {"dispatch": dsp.current(), "reported_capability": caps[0] if len(caps) == 1 else (caps or None),
            "logs_by_capability": {c: len(v) for c, v in seen.items()}}


def save() -> None:
    (OUT / "gpu-check.json").write_text(json.dumps(RESULTS, indent=2, default=str))


def step(name: str):
    def wrap(fn):
        def run(*args, **kwargs):
            print(f"== {name}", flush=True)
            started = time.monotonic()
            try:
                value = fn(*args, **kwargs)
                RESULTS["steps"][name] = {"ok": True, "seconds": round(time.monotonic() - started, 1), "result": value}
            except Exception as exc:  # recorded; later steps still run
                traceback.print_exc()
                RESULTS["steps"][name] = {"ok": False, "seconds": round(time.monotonic() - started, 1),
                                          "error": f"{type(exc).__name__}: {exc}"}
                value = None
            save()
            return value
        return run
    return wrap


def sh(cmd: list[str] | str, **kw) -> str:
    return subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, check=True, **kw).stdout


def gpu_memory() -> list[dict]:
    if not shutil.which("nvidia-smi"):
        return []
    out = sh(["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"])
    return [dict(zip(("index", "used_mib", "total_mib"), map(int, line.split(",")))) for line in out.strip().splitlines()]



STEPS = ("cuobjdump", "jit", "compare", "real-model", "kld", "diagnostics", "row-split", "two-gpu", "two-gpu-in-process",
         "doctor", "archs", "soak", "soak-v4", "glm5", "soak-glm5", "drafts", "memory-plan", "nvfp4")


def finish() -> int:
    import tarfile

    with tarfile.open(OUT / "server-logs.tar.gz", "w:gz") as tar:
        tar.add(LOGS, arcname="server-logs")
    RESULTS["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    RESULTS.setdefault("dispatch", {}).update(dispatch_record())
    RESULTS["reported_capability"] = RESULTS["dispatch"]["reported_capability"]
    save()
    failed = [name for name, s in RESULTS["steps"].items() if not s["ok"]]
    print("failed steps:", failed or "none")
    return 1 if failed else 0


def synth_preset(models: Path, preset: str) -> bool:
    from pyllm_a100.synth import synthesize

    synthesize(preset, models / f"{preset}.gguf", seed=42)
    return True
