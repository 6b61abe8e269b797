"""What the runs on the package's own build share (lab.runs.gpu_cotenancy, lab.runs.gpu_multidevice): which build
they use, its column label with the dispatch, and the environment each llama.cpp child gets.

The build is the package itself, as ``pyllm serve`` runs it: ``--site DIR`` names the folder lab.runs.gpu_package
installed it into (the GPU machine; the run starts itself again with DIR leading PYTHONPATH and without
PYLLM_NATIVE_DIR, which lab/scripts/gpu-decode-env points at a templates-only folder), else the installed package's
build (a CPU machine; the checkout's Python code with the installed llama.cpp). Its columns are ``pyllm@a100`` (every
llama-server, rpc-server and in-process child with lab/scripts/a100-dispatch.c preloaded) and ``pyllm`` (native).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from lab.bench import dispatch as dsp

BUILD = "pyllm"


def parser(doc: str | None, stages: list[str], models: str, ctx_size: int) -> argparse.ArgumentParser:
    """The options both runs take: STAGE..., --work, --site, --columns, the dispatch, --models, --ctx-size,
    --server-args, --ready-timeout."""
    import shlex

    from lab.bench.lab_models import MODELS

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", choices=[*stages, "all"])
    add_arguments(ap)
    ap.add_argument("--models", default=models, help=f"names ({', '.join(MODELS)}) or .gguf paths")
    ap.add_argument("--ctx-size", type=int, default=ctx_size, help="each server's KV pool (tokens)")
    ap.add_argument("--server-args", type=shlex.split, default=[], help="more llama-server flags for every server (a "
                    "quoted string, e.g. '-t 1' on a small CPU machine)")
    ap.add_argument("--ready-timeout", type=float, default=1800, help="seconds a server may take to load")
    return ap


def add_arguments(ap: argparse.ArgumentParser, columns: str = "pyllm@a100,pyllm") -> None:
    ap.add_argument("--work", default="/tmp/dec", help="models (WORK/NAME.gguf), logs and results (WORK/results)")
    ap.add_argument("--site", help="the folder lab.runs.gpu_package installed the package into (default: the "
                    "installed package's build)")
    ap.add_argument("--columns", default=columns, help="pyllm[@DISPATCH],...: the package's build under each dispatch, "
                    "in this order")
    dsp.add_arguments(ap)


def prepare(a: argparse.Namespace) -> None:
    """Import the build the run measures (see the module's docstring); re-executes with --site."""
    if a.site:
        from lab.bench import stages

        if not (Path(a.site) / "pyllm_a100" / "_native").is_dir():
            raise SystemExit(f"--site {a.site}: no pyllm_a100/_native there: install the package with its build first "
                             "(python -m lab.runs.gpu_package --site DIR)")
        stages.reexec_with_pythonpath(os.path.abspath(a.site), unset=("PYLLM_NATIVE_DIR",))
    else:
        from lab.bench.native_view import use_installed_build

        use_installed_build()


def columns(text: str, default: str) -> list[tuple[str, str]]:
    """[(column name, dispatch)]: pyllm@a100 -> ("pyllm@a100", "a100"), pyllm -> ("pyllm", "native")."""
    out = []
    for name, base, disp in dsp.expand_columns(text.split(","), default):
        if base != BUILD:
            raise dsp.DispatchError(f"column {name}: these runs measure the package's own build: write {BUILD}[@DISPATCH]")
        out.append((name, disp))
    return out


def child_env(dispatcher: dsp.Dispatcher, disp: str) -> dict[str, str]:
    """A whole environment for a child of this dispatch (the package's ManagedProcess takes it as given)."""
    return dict(os.environ, **dispatcher.env(disp))


def native() -> Path:
    from pyllm_a100.llamacpp.native import native_dir

    return native_dir()


def record(disp: str, log: str | os.PathLike[str], env: dict[str, str]) -> dict[str, object]:
    """The dispatch a llama-server ran under and the capability reported (its log, else the build's --list-devices)."""
    text = Path(log).read_text(errors="replace") if Path(log).is_file() else ""
    rec = dsp.server_record(disp, text, native(), env)
    rec.pop("text", None)
    return rec
