"""What the staged GPU runs share: the stage loop of gpu_decode, gpu_cotenancy and gpu_multidevice, and how a run
starts itself again (python -m lab.runs.NAME with another environment: the dispatch's LD_PRELOAD, a site folder).

Each stage is a function (args, work, res) that fills ``res``; the loop times it, records its failure (the next stages
still run) and writes WORK/FOLDER/STAGE.json; "report" always runs last and writes no stage file of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
Stage = Callable[[argparse.Namespace, str, dict], None]


def expand(asked: Iterable[str], every: list[str]) -> list[str]:
    """The stages asked for, "all" standing for ``every`` (in its order), then "report" unless asked for already."""
    stages = [s for st in asked for s in (every if st == "all" else [st])]
    return stages + ([] if "report" in stages else ["report"])


def run(stages: list[str], table: Mapping[str, Stage], a: argparse.Namespace, w: str, folder: str,
        fields: Mapping[str, object] | None = None, idle: Callable[[str], object] | None = None) -> int:
    """Run ``stages`` (after expand()) in order; 1 if one failed, else 0. ``fields``: more entries each stage's record
    starts with (the command that reproduces the run); ``idle(stage)``: the record's "dispatch" when the stage left
    none (a stage that ran no llama.cpp process says so)."""
    rc = 0
    for st in stages:
        res, t0 = {"ok": False, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), **(fields or {})}, time.time()
        print(f"== {st} ({res['started']})", flush=True)
        try:
            table[st](a, w, res)
            res["ok"] = True
        except Exception as e:  # recorded; the next stages still run
            res["error"] = f"{type(e).__name__}: {e}"
            res["traceback"] = traceback.format_exc()[-3000:]
            print(f"   {st} failed: {res['error']}", flush=True)
            rc = 1
        res["seconds"] = round(time.time() - t0, 1)
        if idle is not None:
            res.setdefault("dispatch", idle(st))
        if st != "report":
            with open(os.path.join(folder, f"{st}.json"), "w") as f:
                json.dump(res, f, indent=1)
    return rc


def own_argv() -> list[str]:
    """This process's command line as it can be run again: ``python -m lab.runs.NAME ARGS`` for a module run with -m
    (its sys.argv[0] is the file, which would run outside the package), else the interpreter and sys.argv."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return [sys.executable, "-m", spec.name, *sys.argv[1:]]
    return [sys.executable, *sys.argv]


def reexec_with_pythonpath(first: str, unset: Iterable[str] = ()) -> None:
    """Run this process again with ``first`` and then this checkout leading PYTHONPATH, and the current folder left out
    (PYTHONSAFEPATH), so that what is installed in ``first`` is imported before the checkout's source tree and the
    interpreter's own packages, in this process and in every child; returns when they already lead. ``unset``: variables
    the new process goes without (PYLLM_NATIVE_DIR pointing at another build)."""
    lead = [first, str(REPO)]
    have = os.environ.get("PYTHONPATH", "")
    gone = [name for name in unset if name in os.environ]
    if have.split(os.pathsep)[:2] == lead and os.environ.get("PYTHONSAFEPATH") and not gone:
        return
    env = {k: v for k, v in os.environ.items() if k not in gone}
    argv = own_argv()
    os.execve(argv[0], argv, dict(env, PYTHONPATH=os.pathsep.join(filter(None, [*lead, have])), PYTHONSAFEPATH="1"))


def command(module: str, args: Iterable[str]) -> list[str]:
    """The argv that reproduces a run, as results record it: python -m lab.runs.NAME ARGS."""
    return ["python", "-m", module, *args]
