"""A100 dispatch on a newer GPU (issue 41): the LD_PRELOAD shim lab/scripts/a100-dispatch.c, the environment that
turns it on for one llama.cpp process, the column syntax that mixes dispatches in one run, and the proof.

An H200 runs the sm_80 build through PTX JIT but reports compute capability 9.0, 132 SMs and 227 KiB of opt-in
shared memory, so llama.cpp's host-side choices (kernels by compute capability, MMQ/MMVQ limits, tile and grid sizes)
are not an A100's. With ``--dispatch a100`` every llama.cpp process a lab script starts runs with the shim preloaded
and reports an A100-SXM4 (cc 8.0, 108 SMs, 163 KiB opt-in, 164 KiB per SM, 40 MiB L2). The proof is llama.cpp's own
log line, ``Device 0: NVIDIA H200, compute capability 8.0, VMM: yes``: every result file records ``dispatch`` and
the ``reported_capability`` read back from it (reported_capability()).

Columns: ``BUILD[+SWITCH...][@DISPATCH]``, e.g. ``pin``, ``patched``, ``pin@a100``, ``patched@a100``; a column
without ``@`` takes the script's ``--dispatch`` (default native). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

DISPATCHES = ("native", "a100")
A100_CAPABILITY = "8.0"
SHIM_SOURCE = Path(__file__).resolve().parents[1] / "scripts" / "a100-dispatch.c"
SHIM_NAME = "a100-dispatch"
WRAPPED = ("cudaGetDeviceProperties", "cudaGetDeviceProperties_v2", "cudaDeviceGetAttribute",
           "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags")

# ggml-cuda's device line (CUDA build): "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143167 MiB"
DEVICE_LINE = re.compile(r"Device (\d+): ([^\n,]+), compute capability (\d+\.\d+)")
SHIM_LINE = re.compile(r"a100-dispatch: device (\d+) reported as cc (\d+\.\d+)")


class DispatchError(RuntimeError):
    """The shim cannot be built or used: the message says what to do."""


def split_column(spec: str, default: str = "native") -> tuple[str, str]:
    """``"patched+HC@a100"`` -> ``("patched+HC", "a100")``; ``"pin"`` -> ``("pin", default)``."""
    base, sep, dispatch = spec.partition("@")
    dispatch = dispatch if sep else default
    if not base or dispatch not in DISPATCHES:
        raise DispatchError(f"column {spec!r}: write BUILD[+SWITCH...][@DISPATCH] with DISPATCH one of "
                            f"{', '.join(DISPATCHES)}, e.g. patched@a100")
    return base, dispatch


def column_name(base: str, dispatch: str, default: str = "native") -> str:
    """The column's name as results show it: ``patched`` (the default dispatch) or ``patched@a100``."""
    return base if dispatch == default else f"{base}@{dispatch}"


def expand_columns(specs: Iterable[str], default: str = "native") -> list[tuple[str, str, str]]:
    """[(name, base, dispatch)] for each spec, the name with its ``@DISPATCH`` whenever it is not ``native``."""
    out = []
    for spec in specs:
        base, dispatch = split_column(spec.strip(), default)
        out.append((column_name(base, dispatch), base, dispatch))
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise DispatchError(f"columns {','.join(specs)}: a column is named twice")
    return out


def _without_shim(preload: str) -> list[str]:
    return [p for p in re.split(r"[:\s]+", preload or "") if p and SHIM_NAME not in os.path.basename(p)]


def preload_env(dispatch: str, shim: str | os.PathLike[str] | None, inherited: str | None = None) -> dict[str, str]:
    """The environment entries that give a child process this dispatch: LD_PRELOAD with the shim first (a100), or
    LD_PRELOAD without it (native: a shim inherited from a re-executed parent is taken out). ``inherited``: the
    LD_PRELOAD the child would otherwise get (default: this process's)."""
    if dispatch not in DISPATCHES:
        raise DispatchError(f"dispatch {dispatch!r}: choose one of {', '.join(DISPATCHES)}")
    rest = _without_shim(os.environ.get("LD_PRELOAD", "") if inherited is None else inherited)
    if dispatch == "a100":
        if not shim:
            raise DispatchError("--dispatch a100 needs the shim: --dispatch-shim PATH, or let the script build it "
                                "(gcc and the CUDA headers)")
        return {"LD_PRELOAD": ":".join([str(Path(shim).resolve()), *rest])}
    if rest or (os.environ.get("LD_PRELOAD") if inherited is None else inherited):
        return {"LD_PRELOAD": ":".join(rest)}
    return {}


def current(env: Mapping[str, str] | None = None) -> str:
    """The dispatch a process started with ``env`` (default: this one's) gets: a100 when the shim is preloaded."""
    preload = (os.environ if env is None else env).get("LD_PRELOAD", "")
    return "a100" if any(SHIM_NAME in os.path.basename(p) for p in re.split(r"[:\s]+", preload) if p) else "native"


def cuda_include(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """A folder holding cuda_runtime_api.h: the argument, $CUDA_HOME/include, $CUDA_PATH/include, nvcc's toolkit,
    /usr/local/cuda/include; None when there is none."""
    candidates = [explicit, os.environ.get("CUDA_HOME") and Path(os.environ["CUDA_HOME"]) / "include",
                  os.environ.get("CUDA_PATH") and Path(os.environ["CUDA_PATH"]) / "include"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parents[1] / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if c and (Path(c) / "cuda_runtime_api.h").is_file():
            return Path(c)
    return None


def build_shim(out: str | os.PathLike[str], *, source: Path = SHIM_SOURCE, include: str | os.PathLike[str] | None = None,
               compiler: str | None = None) -> Path:
    """Compile the shim into ``out`` (kept when newer than the source); returns its path."""
    out = Path(out)
    if out.is_file() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    inc = cuda_include(include)
    if inc is None:
        raise DispatchError("no cuda_runtime_api.h (looked in $CUDA_HOME, $CUDA_PATH, nvcc's toolkit, /usr/local/cuda): "
                            "pass --dispatch-shim PATH to a shim built elsewhere with the program's CUDA toolkit")
    cc = compiler or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise DispatchError("no C compiler (gcc/cc) to build the a100-dispatch shim: pass --dispatch-shim PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cc, "-shared", "-fPIC", "-O2", f"-I{inc}", "-o", str(out), str(source), "-ldl"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise DispatchError(f"building the shim failed ({' '.join(cmd)}): {p.stderr.strip()[-600:]}")
    return out


def exported(library: str | os.PathLike[str]) -> set[str]:
    """The dynamic symbols ``library`` defines (nm -D --defined-only)."""
    p = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    return {line.split()[-1].split("@")[0] for line in p.stdout.splitlines() if line.strip()}


def imported(library: str | os.PathLike[str]) -> list[str]:
    """Which of the wrapped functions ``library`` (libggml-cuda.so) takes from a shared libcudart: the ones the shim
    can reach. Empty: a static runtime (GGML_STATIC), and --dispatch a100 would change nothing."""
    p = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True)
    names = {line.split()[-1].split("@")[0] for line in p.stdout.splitlines() if line.strip()}
    return sorted(n for n in WRAPPED if n in names)


def reported_capability(text: str, device: int = 0) -> str | None:
    """The compute capability llama.cpp logged for ``device`` ("8.0" under the shim on an H200, "9.0" without)."""
    for m in DEVICE_LINE.finditer(text or ""):
        if int(m[1]) == device:
            return m[3]
    return None


def record(dispatch: str, text: str) -> dict[str, object]:
    """What every result file keeps per llama.cpp run: the dispatch asked for, the capability llama.cpp reported, the
    shim's own line seen, and a problem when they disagree (a100 asked and something else reported, or the shim
    active in a native run)."""
    cap, shim_line = reported_capability(text), bool(SHIM_LINE.search(text or ""))
    out: dict[str, object] = {"dispatch": dispatch, "reported_capability": cap, "shim_line": shim_line}
    problem = check(dispatch, cap, shim_line)
    if problem:
        out["problem"] = problem
    return out


def check(dispatch: str, capability: str | None, shim_line: bool = False) -> str | None:
    """None when the reported capability is the one the dispatch promises, else why not."""
    if capability is None:
        return "llama.cpp printed no 'Device 0: ..., compute capability' line (a CPU-only build, or the log was not kept)"
    if dispatch == "a100" and capability != A100_CAPABILITY:
        return f"--dispatch a100 asked, llama.cpp reported compute capability {capability}: the shim did not take"
    if dispatch == "native" and shim_line:
        return "native dispatch asked, but the a100-dispatch shim answered (left in LD_PRELOAD?)"
    return None


def probe(bin_dir: str | os.PathLike[str], env: Mapping[str, str], timeout: float = 300) -> dict[str, object]:
    """Ask one of the build's programs what it sees (``--list-devices``: ggml-cuda prints its device lines at start),
    for result files whose runs keep no log of their own."""
    for name in ("llama-bench", "llama-server", "llama-cli", "llama-completion"):
        exe = Path(bin_dir) / name
        if exe.is_file():
            p = subprocess.run([str(exe), "--list-devices"], capture_output=True, text=True, errors="replace", timeout=timeout,
                               env=dict(env, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(bin_dir), env.get("LD_LIBRARY_PATH")]))))
            return {"program": name, "text": (p.stdout + p.stderr)[-3000:],
                    **record(current(env), p.stdout + p.stderr)}
    return {"program": None, "reported_capability": None, "problem": f"no llama.cpp program in {bin_dir}"}


def server_record(dispatch: str, log_text: str, bin_dir: str | os.PathLike[str], env: Mapping[str, str]) -> dict[str, object]:
    """record() of a llama-server log. llama-server logs no ggml-cuda device line, so when its log names no capability
    the build's ``--list-devices`` under the same environment (the shim included) answers instead (probe, text left
    out)."""
    rec = record(dispatch, log_text)
    if rec["reported_capability"] is None:
        asked = probe(bin_dir, env)
        rec = dict(record(dispatch, asked["text"]), program=asked["program"]) if asked["program"] else \
            dict(rec, program=None, problem=asked["problem"])
    return rec


class Dispatcher:
    """A script's dispatch settings: the default for columns without ``@``, the shim (built once, on first need)."""

    def __init__(self, default: str = "native", shim: str | os.PathLike[str] | None = None,
                 build_dir: str | os.PathLike[str] | None = None) -> None:
        if default not in DISPATCHES:
            raise DispatchError(f"--dispatch {default}: choose one of {', '.join(DISPATCHES)}")
        self.default = default
        self._shim = Path(shim).resolve() if shim else None
        self.build_dir = Path(build_dir or "/tmp")
        self.built = False

    @property
    def shim(self) -> Path:
        if self._shim is None:
            self._shim = build_shim(self.build_dir / "a100-dispatch.so")
            self.built = True
        if not self._shim.is_file():
            raise DispatchError(f"--dispatch-shim {self._shim}: no such file")
        return self._shim

    def env(self, dispatch: str, inherited: str | None = None) -> dict[str, str]:
        """The entries to add to a child's environment for ``dispatch``."""
        return preload_env(dispatch, self.shim if dispatch == "a100" else None, inherited)

    def split(self, spec: str) -> tuple[str, str]:
        return split_column(spec, self.default)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--dispatch and --dispatch-shim, the same on every GPU entry point."""
    parser.add_argument("--dispatch", choices=DISPATCHES, default="native",
                        help="native: the GPU's own properties; a100: every llama.cpp process runs with the "
                             "a100-dispatch shim (LD_PRELOAD) and reports an A100 (cc 8.0, 108 SMs, 163 KiB opt-in smem, "
                             "40 MiB L2). Columns may pick their own with BUILD@DISPATCH. Default native")
    parser.add_argument("--dispatch-shim", metavar="PATH", help="a prebuilt lab/scripts/a100-dispatch.c .so (default: "
                        "built once with gcc and the CUDA headers)")


def from_args(args: argparse.Namespace, build_dir: str | os.PathLike[str] | None = None) -> Dispatcher:
    return Dispatcher(args.dispatch, args.dispatch_shim, build_dir)

