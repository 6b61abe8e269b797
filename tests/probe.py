"""The reliability probe: bad inputs, hostile HTTP, load, faults and security, against real processes.

Each section is a function that runs real `pyllm` commands, real llama-server processes, a real
loopback hub (tests/hub.py) and real HTTP clients, and returns rows (plain dicts) that
python -m lab.tools.reliability renders into docs/reliability.md. tests/test_reliability.py runs the same
functions with smaller sizes (the fast part CI runs) and asserts on the rows.

Nothing here imitates our own code: what is measured is what a user's shell would see.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

HERE = Path(__file__).resolve().parent
PYLLM = Path(sys.executable).parent / "pyllm"
CHILDREN = ("llama-server", "rpc-server", "ggml-rpc-server")
EX_CONFIG = 78  # `pyllm serve`'s exit status for configuration errors (pyllm_a100.errors.EX_CONFIG); other commands exit 1


# --- running pyllm -------------------------------------------------------------------------


def pyllm(*args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYLLM_HOME=str(home), **(env or {}))
    return subprocess.run([str(PYLLM), *args], capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=str(cwd) if cwd else None, stdin=subprocess.DEVNULL)


def one_line(result: subprocess.CompletedProcess) -> str:
    """The last line of stderr (or stdout): where the error line is."""
    text = (result.stderr.strip() or result.stdout.strip())
    return text.splitlines()[-1] if text else ""


def children_using(root: Path) -> list[psutil.Process]:
    """llama-server / rpc-server processes whose command line names a path under ``root``."""
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if p.info["name"] in CHILDREN and str(root) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


def files_under(root: Path) -> set[str]:
    if not root.exists():
        return set()
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@contextlib.contextmanager
def tmpfs(size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A small tmpfs (for disk-full and read-only cases); raises Unavailable where mounting is impossible."""
    folder = Path(tempfile.mkdtemp(prefix="pyllm-tmpfs-"))
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(folder)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        folder.rmdir()
        raise Unavailable(f"cannot mount a tmpfs here ({result.stderr.strip() or 'mount failed'}; needs root or CAP_SYS_ADMIN)")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        with contextlib.suppress(OSError):
            folder.rmdir()


class Unavailable(Exception):
    """A case that cannot run on this machine (the reason is reported, never a pass)."""


# --- the shared workspace --------------------------------------------------------------------


@dataclasses.dataclass
class Workspace:
    root: Path
    model: Path
    shards: list[Path]
    paths: dict[str, str]  # placeholder -> real path
    names: dict[str, str]  # placeholder -> what the report shows


def make_workspace(root: Path, model: Path | None = None) -> Workspace:
    """The files the bad-input cases point at: a tiny model, a 3-shard set and broken variants of both."""
    from pyllm_a100.synth import synthesize

    root.mkdir(parents=True, exist_ok=True)
    if model is None:
        model = synthesize("tiny-deepseek4", root / "m.gguf", seed=42).first
    shards = list(synthesize("tiny-deepseek4", root / "set" / "s.gguf", split_max_size="12M", seed=42).paths)
    data = model.read_bytes()
    (root / "truncated.gguf").write_bytes(data[: len(data) // 2])
    (root / "header-cut.gguf").write_bytes(data[:1000])
    (root / "weights.gguf").write_bytes(b"PK\x03\x04 a zip file, not a model")
    broken = root / "broken"
    broken.mkdir(exist_ok=True)
    for shard in shards[:2]:
        target = broken / shard.name
        if not target.exists():
            target.symlink_to(shard)
    unknown_arch_model(root / "future.gguf")
    (root / "a-file").write_text("not a folder\n")
    (root / "empty").mkdir(exist_ok=True)
    two = root / "two-quants"
    for quant, src in (("Q4_0", model), ("Q8_0", model)):
        (two / quant).mkdir(parents=True, exist_ok=True)
        target = two / quant / f"m-{quant}.gguf"
        if not target.exists():
            target.symlink_to(src)
    paths = {"model": str(model), "shard2": str(shards[1]), "broken": str(broken / shards[0].name),
             "truncated": str(root / "truncated.gguf"), "headercut": str(root / "header-cut.gguf"),
             "notgguf": str(root / "weights.gguf"), "future": str(root / "future.gguf"), "file": str(root / "a-file"),
             "empty": str(root / "empty"), "two": str(two), "dir": str(root)}
    names = {"model": "m.gguf", "shard2": "s-00002-of-00003.gguf", "broken": "broken/s-00001-of-00003.gguf",
             "truncated": "truncated.gguf", "headercut": "header-cut.gguf", "notgguf": "weights.gguf (a zip)",
             "future": "future.gguf (arch future-arch-9)", "file": "a-file", "empty": "empty/", "two": "two-quants/",
             "dir": "DIR"}
    return Workspace(root, model, shards, paths, names)


def unknown_arch_model(path: Path) -> Path:
    """A GGUF of an architecture no llama.cpp knows (one tensor; written once per path)."""
    import gguf
    import numpy as np

    if path.exists():
        return path
    w = gguf.GGUFWriter(path, "future-arch-9")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --- 1. bad inputs ---------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    group: str
    name: str
    args: list[str]  # {placeholders} from the workspace, {port} a busy port, {out} the case's scratch folder
    expect: str  # text the one line must contain
    rc: int = 1
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    setup: str | None = None  # "busy-port", "home-file", "hub", "ro-fs", "full-fs", "state-list", "state-forged", ...


def bad_input_cases() -> list[Case]:
    S = "serve"
    return [
        Case("build-info", "unknown option", ["build-info", "--jsn"], "No such option: --jsn", rc=2),
        Case("synth", "unknown preset", ["synth", "tiny-gpt9", "-o", "{out}/x.gguf"], "unknown preset 'tiny-gpt9'"),
        Case("synth", "output not .gguf", ["synth", "tiny-llama", "-o", "{out}/x.bin"], "must end in .gguf"),
        Case("synth", "output is a folder", ["synth", "tiny-llama", "-o", "{empty}"], "must end in .gguf"),
        Case("synth", "--layers 0", ["synth", "tiny-deepseek4", "--layers", "0", "-o", "{out}/x.gguf"], "--layers 0: must be between 1"),
        Case("synth", "unknown --type", ["synth", "tiny-llama", "--type", "q3_k", "-o", "{out}/x.gguf"], "unknown weight type 'q3_k'"),
        Case("synth", "--split-max-size abc", ["synth", "tiny-llama", "--split-max-size", "abc", "-o", "{out}/x.gguf"], "not a positive size"),
        Case("synth", "--experts on a dense preset", ["synth", "tiny-llama", "--experts", "4", "-o", "{out}/x.gguf"], "has no routed experts"),
        Case("synth", "-o under a file", ["synth", "tiny-llama", "-o", "{file}/x.gguf"], "is a file, not a folder"),
        Case("synth", "-o on a read-only filesystem", ["synth", "tiny-llama", "-o", "{fs}/x.gguf"], "cannot write to", setup="ro-fs"),
        Case("synth", "nearly full disk", ["synth", "tiny-deepseek4", "-o", "{fs}/x.gguf"], "plus a 1 % + 64 MiB margin", setup="full-fs"),
        Case("fetch", "not a repo name", ["fetch", "just-a-name"], "is not a repository name"),
        Case("fetch", "a path as the repo", ["fetch", "../x"], "is not a repository name"),
        Case("fetch", "non-ASCII repo name", ["fetch", "ünï/cödé"], "is not a repository name"),
        Case("fetch", "--workers 0", ["fetch", "unsloth/Tiny-GLM-GGUF", "--workers", "0"], "--workers 0: must be at least 1"),
        Case("fetch", "empty --include", ["fetch", "unsloth/Tiny-GLM-GGUF", "--include", ""], "--include '': give a glob"),
        Case("fetch", "empty --revision", ["fetch", "unsloth/Tiny-GLM-GGUF", "--revision", ""], "--revision '': give a branch"),
        Case("fetch", "empty --local-dir", ["fetch", "unsloth/Tiny-GLM-GGUF", "--local-dir", ""], "--local-dir '': give a folder"),
        Case("fetch", "token with a space", ["fetch", "unsloth/Tiny-GLM-GGUF", "--token", "hf_abc def"], "holds spaces or control characters"),
        Case("fetch", "--local-dir is a file", ["fetch", "unsloth/Tiny-GLM-GGUF", "--local-dir", "{file}"], "is a file, not a folder", setup="hub"),
        Case("fetch", "unknown --source", ["fetch", "unsloth/Tiny-GLM-GGUF", "--source", "s3"], "--source s3: choose one of", setup="hub"),
        Case("fetch", "repo not on the hub", ["fetch", "nobody/nothing-GGUF"], "was not found", setup="hub"),
        Case("fetch", "pattern matches nothing", ["fetch", "unsloth/Tiny-GLM-GGUF", "--include", "Q9_9/*"], "nothing in unsloth/Tiny-GLM-GGUF matches", setup="hub"),
        Case("fetch", "PYLLM_HOME is a file", ["fetch", "unsloth/Tiny-GLM-GGUF"], "is a file, not a folder", setup="home-file,hub"),
        Case("fetch", "hub unreachable", ["fetch", "unsloth/Tiny-GLM-GGUF"], "cannot reach", setup="dead-hub"),
        Case(S, "missing file", [S, "{out}/nope.gguf"], "does not exist", rc=EX_CONFIG),
        Case(S, "shard 2 given", [S, "{shard2}"], "is shard 2 of 3: give shard 1", rc=EX_CONFIG),
        Case(S, "a shard missing", [S, "{broken}"], "1 shard(s) are missing", rc=EX_CONFIG),
        Case(S, "truncated file", [S, "{truncated}"], "is truncated (", rc=EX_CONFIG),
        Case(S, "cut inside the header", [S, "{headercut}"], "is truncated or corrupt", rc=EX_CONFIG),
        Case(S, "not a GGUF", [S, "{notgguf}"], "is not a GGUF file", rc=EX_CONFIG),
        Case(S, "unknown architecture", [S, "{future}"], "architecture 'future-arch-9' is unknown", rc=EX_CONFIG),
        Case(S, "empty folder", [S, "{empty}"], "holds no .gguf file", rc=EX_CONFIG),
        Case(S, "two sets below a folder", [S, "{two}"], "holds 2 models in its subfolders", rc=EX_CONFIG),
        Case(S, "--tensor-split 1x0", [S, "{model}", "--tensor-split", "1x0"], "count after x must be at least 1", rc=EX_CONFIG),
        Case(S, "--tensor-split abc", [S, "{model}", "--tensor-split", "abc"], "is not WEIGHT or WEIGHTxCOUNT", rc=EX_CONFIG),
        Case(S, "--tensor-split abc, port busy", [S, "{model}", "--tensor-split", "abc", "--port", "{port}"], "is not WEIGHT or WEIGHTxCOUNT", rc=EX_CONFIG, setup="busy-port"),
        Case(S, "more split parts than GPUs", [S, "{model}", "--tensor-split", "1x8"], "GPU", rc=EX_CONFIG),
        Case(S, "more split parts than GPUs, port busy", [S, "{model}", "--tensor-split", "1x8", "--port", "{port}"], "GPU", rc=EX_CONFIG, setup="busy-port"),
        Case(S, "port in use", [S, "{model}", "--port", "{port}"], "is already in use", setup="busy-port"),
        Case(S, "port held by a command with newlines", [S, "{model}", "--port", "{port}"], "is already in use by PID", setup="busy-port-newline"),
        Case(S, "--port 70000", [S, "{model}", "--port", "70000"], "must be between 1 and 65535", rc=EX_CONFIG),
        Case(S, "--port abc", [S, "{model}", "--port", "abc"], "Invalid value for '--port'", rc=2),
        Case(S, "--ctx-size 0", [S, "{model}", "--ctx-size", "0"], "--ctx-size 0: must be a positive", rc=EX_CONFIG),
        Case(S, "--parallel 0", [S, "{model}", "--parallel", "0"], "--parallel 0: must be at least 1", rc=EX_CONFIG),
        Case(S, "--split-mode diagonal", [S, "{model}", "--split-mode", "diagonal"], "choose one of layer, tensor, none", rc=EX_CONFIG),
        Case(S, "--split-mode row", [S, "{model}", "--split-mode", "row"], "has no row-split buffers", rc=EX_CONFIG),
        Case(S, "--host not.a.host", [S, "{model}", "--host", "not.a.host"], "not a name this machine resolves", rc=EX_CONFIG),
        Case(S, "--host not on this machine", [S, "{model}", "--host", "203.0.113.7", "--api-key", "k3y"], "is not an address of this machine", rc=EX_CONFIG),
        Case(S, "--api-key ''", [S, "{model}", "--host", "0.0.0.0", "--api-key", ""], "--api-key is empty", rc=EX_CONFIG),
        Case(S, "--api-key of spaces", [S, "{model}", "--host", "0.0.0.0", "--api-key", "   "], "--api-key is empty", rc=EX_CONFIG),
        Case(S, "--restart -1", [S, "{model}", "--restart", "-1", "--detach"], "--restart -1: must be 0", rc=EX_CONFIG),
        Case(S, "--gpus naming a GPU twice", [S, "{model}", "--gpus", "0-3,2"], "GPU 2 is named twice", rc=EX_CONFIG),
        Case(S, "--n-gpu-layers -5", [S, "{model}", "--n-gpu-layers", "-5"], "--n-gpu-layers -5: give 0", rc=EX_CONFIG),
        Case(S, "--alias ''", [S, "{model}", "--alias", ""], "--alias '': give the model name", rc=EX_CONFIG),
        Case(S, "--cors-origins ''", [S, "{model}", "--cors-origins", " "], "--cors-origins ' ': give the origins", rc=EX_CONFIG),
        Case(S, "--rpc ''", [S, "{model}", "--rpc", ""], "--rpc '' is empty: give HOST:PORT"),
        Case(S, "PYLLM_HOME is a file", [S, "{model}", "--port", "0"], "is a file, not a folder", rc=EX_CONFIG, setup="home-file"),
        Case(S, "PYLLM_HOME under a file", [S, "{model}", "--port", "0"], "which is a file", rc=EX_CONFIG, setup="home-under-file"),
        Case("generate", "--ctx-size -1", ["generate", "{model}", "hi", "--ctx-size", "-1"], "--ctx-size -1: must be a positive"),
        Case("generate", "--max-tokens -5", ["generate", "{model}", "hi", "--max-tokens", "-5"], "--max-tokens -5: must be at least 1"),
        Case("generate", "missing model", ["generate", "{out}/nope.gguf", "hi"], "does not exist"),
        Case("ps/stop/logs", "stop an unknown name", ["stop", "nosuch"], "no managed server named 'nosuch'"),
        Case("ps/stop/logs", "logs with none running", ["logs"], "no managed server is running"),
        Case("ps/stop/logs", "stop a bad name", ["stop", "../etc"], "no managed server named '../etc'"),
        Case("ps/stop/logs", "ps, state.json is a list", ["ps"], "removed stale entry ghost", rc=0, setup="state-list"),
        Case("ps/stop/logs", "stop --all, forged PID", ["stop", "--all"], "removed stale entry ghost", rc=0, setup="state-forged"),
        Case("ps/stop/logs", "ps, PYLLM_HOME is a file", ["ps"], "is a file, not a folder", setup="home-file"),
        Case("rpc-worker", "--host 0.0.0.0 without --allow-network", ["rpc-worker", "--host", "0.0.0.0"], "would expose rpc-server on every interface"),
        Case("rpc-worker", "non-loopback host", ["rpc-worker", "--host", "10.1.2.3"], "is not loopback"),
        Case("rpc-worker", "--host not.a.host", ["rpc-worker", "--host", "not.a.host"], "not a name this machine resolves"),
        Case("rpc-worker", "--port 0", ["rpc-worker", "--port", "0"], "--port 0: must be between 1 and 65535"),
        Case("rpc-worker", "--threads 0", ["rpc-worker", "--threads", "0"], "--threads 0: must be at least 1"),
        Case("rpc-worker", "--restart -1", ["rpc-worker", "--restart", "-1"], "--restart -1: must be 0"),
        Case("doctor", "missing model", ["doctor", "{out}/nope.gguf"], "does not exist"),
        Case("doctor", "--rpc not HOST:PORT", ["doctor", "--rpc", "nonsense"], "HOST:PORT"),
        Case("doctor", "--rpc ''", ["doctor", "--rpc", ""], "--rpc '' is empty"),
    ]


def _busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def run_bad_input(case: Case, ws: Workspace, scratch: Path) -> dict[str, Any]:
    """Run one case in its own PYLLM_HOME and scratch folder; the row says what happened and what is left."""
    scratch.mkdir(parents=True, exist_ok=True)
    home = scratch / "home"
    out = scratch / "out"
    out.mkdir(exist_ok=True)
    env = dict(case.env)
    values = dict(ws.paths, out=str(out))
    names = dict(ws.names, out="DIR")
    row: dict[str, Any] = {"group": case.group, "case": case.name}
    setups = set((case.setup or "").split(","))
    with contextlib.ExitStack() as stack:
        if "busy-port" in setups:
            busy = stack.enter_context(_busy_port())
            values["port"], names["port"] = str(busy.getsockname()[1]), "BUSY_PORT"
        if "busy-port-newline" in setups:
            values["port"], names["port"] = str(stack.enter_context(_listener_with_newlines())), "BUSY_PORT"
        if "home-file" in setups:
            home = scratch / "home-is-a-file"
            home.write_text("")
        if "home-under-file" in setups:
            (scratch / "plain-file").write_text("")
            home = scratch / "plain-file" / "home"
        if setups & {"ro-fs", "full-fs"}:
            try:
                fs = stack.enter_context(tmpfs("1m" if "full-fs" in setups else "400m", read_only="ro-fs" in setups))
            except Unavailable as exc:
                return dict(row, command=_display(case, names), skipped=str(exc), ok=None)
            values["fs"] = str(fs)
            names["fs"] = "RO_FS" if "ro-fs" in setups else "FULL_FS"
        if setups & {"hub", "dead-hub"}:
            env.update(_hub_env(stack, scratch, dead="dead-hub" in setups))
            values["hub"], names["hub"] = env["HF_ENDPOINT"], "http://HUB"
        forged = None
        if setups & {"state-list", "state-forged"}:
            directory = home / "servers" / "ghost"
            directory.mkdir(parents=True)
            if "state-list" in setups:
                (directory / "state.json").write_text("[1, 2, 3]\n")
            else:
                forged = stack.enter_context(_unrelated_process())
                (directory / "state.json").write_text(json.dumps(
                    {"name": "ghost", "status": "ready", "supervisor_pid": forged.pid, "started_at": time.time() + 3600}))
        argv = [a.format(**values) for a in case.args]
        before_files = files_under(home) | {f"out/{f}" for f in files_under(out)}
        started = time.monotonic()
        result = pyllm(*argv, home=home, env=env, timeout=180)
        seconds = time.monotonic() - started
        left = sorted((files_under(home) if home.is_dir() else set()) | {f"out/{f}" for f in files_under(out)}) 
        left = [f for f in left if f not in before_files]
        if "fs" in values:
            left += [f"fs/{f}" for f in files_under(Path(values["fs"]))]
        procs = children_using(ws.root) + children_using(scratch)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        line = one_line(result)
        for key in sorted(values, key=lambda k: -len(values[k])):
            line = line.replace(values[key], names.get(key, key.upper()))
        line = line.replace(str(scratch), "SCRATCH")
        row.update(
            command=_display(case, names), rc=result.returncode, line=line,
            stderr_lines=len(result.stderr.strip().splitlines()), traceback="Traceback" in result.stderr,
            left_behind=left, processes_left=len(procs), seconds=round(seconds, 2),
            expected=case.expect, expected_rc=case.rc,
        )
        if forged is not None:
            row["forged_process_alive"] = forged.poll() is None
        row["ok"] = (result.returncode == case.rc and case.expect in row["line"] and not row["traceback"]
                     and row["stderr_lines"] <= 1 + (case.rc == 0) and not procs and row.get("forged_process_alive", True)
                     and not [f for f in left if f.endswith(".gguf") or "state.json" in f])
    return row


def _display(case: Case, names: dict[str, str]) -> str:
    import shlex

    shown = []
    for a in case.args:
        try:
            shown.append(a.format(**names))
        except KeyError:
            shown.append(a)
    env = {"home-file": "PYLLM_HOME=FILE ", "home-under-file": "PYLLM_HOME=FILE/home "}.get((case.setup or "").split(",")[0], "")
    return env + "pyllm " + " ".join(s if s.startswith(("RO_FS", "FULL_FS")) else shlex.quote(s) for s in shown)


@contextlib.contextmanager
def _listener_with_newlines() -> Iterator[int]:
    """A process listening on a port whose command line holds newlines (its argv is shown in errors)."""
    code = "import socket,sys,time\ns=socket.socket();s.bind(('127.0.0.1',0));s.listen()\nprint(s.getsockname()[1],flush=True);time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", code, "first line\nsecond line\nthird"], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _unrelated_process() -> Iterator[subprocess.Popen]:
    """A process that is not ours (a plain sleep): stop must never signal it."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


REPO = "unsloth/Tiny-GLM-GGUF"


def _hub_env(stack: contextlib.ExitStack, scratch: Path, *, dead: bool = False, files: dict | None = None) -> dict[str, str]:
    sys.path.insert(0, str(HERE))
    from hub import FakeHub

    if dead:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"
    else:
        hub = FakeHub()
        stack.callback(hub.close)
        hub.add_repo(REPO, files or {"Q4_0/Tiny-Q4_0.gguf": b"GGUF" + b"\0" * 64, "README.md": b"# tiny\n"})
        url = hub.url
    return {"HF_ENDPOINT": url, "HF_HOME": str(scratch / "hf-home"), "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def bad_inputs(ws: Workspace, scratch: Path, only: list[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    for i, case in enumerate(bad_input_cases()):
        if only and case.name not in only:
            continue
        rows.append(run_bad_input(case, ws, scratch / f"case-{i:02d}"))
    return rows


# --- a managed server for the HTTP, load and fault sections ----------------------------------------


@dataclasses.dataclass
class Managed:
    name: str
    home: Path
    state: dict[str, Any]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.state['port']}"

    def refresh(self) -> dict[str, Any]:
        from pyllm_a100.serve.state import read_state

        self.state = read_state(self.home / "servers" / self.name / "state.json") or self.state
        return self.state

    def healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


@contextlib.contextmanager
def detached(model: Path, home: Path, name: str, *args: str, timeout: float = 300) -> Iterator[Managed]:
    """`pyllm serve MODEL --detach` (a real supervisor and llama-server); always stopped afterwards."""
    result = pyllm("serve", str(model), "--port", "0", "--detach", "--name", name, *args, home=home, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"pyllm serve --detach failed: {result.stderr.strip()}")
    managed = Managed(name, home, {})
    managed.refresh()
    try:
        yield managed
    finally:
        pyllm("stop", name, home=home, timeout=60)


# --- 2. HTTP bad inputs --------------------------------------------------------------------------------


def http_cases() -> list[tuple[str, Callable[[str], Any]]]:
    headers = {"Content-Type": "application/json"}

    def post(path: str, body: bytes | str, timeout: float = 120) -> Callable[[str], Any]:
        def send(url: str) -> str:
            data = body.encode() if isinstance(body, str) else body
            r = httpx.post(url + path, content=data, headers=headers, timeout=timeout)
            return f"HTTP {r.status_code}"
        return send

    def idle(url: str) -> str:
        host, port = url.removeprefix("http://").split(":")
        socks = []
        try:
            for _ in range(200):
                s = socket.create_connection((host, int(port)), timeout=5)
                socks.append(s)
            time.sleep(2.0)
            r = httpx.get(url + "/health", timeout=30)  # answered while 200 idle connections are open
            return f"{len(socks)} open; /health during: HTTP {r.status_code}"
        finally:
            for s in socks:
                s.close()

    big = json.dumps({"prompt": "a " * (5 << 20), "n_predict": 1})  # ~10 MB
    return [
        ("malformed JSON", post("/v1/chat/completions", '{"messages": [')),
        ("empty body", post("/v1/chat/completions", "")),
        ("10 MB prompt body", post("/completion", big)),
        ("invalid UTF-8 in a string", post("/completion", b'{"prompt": "\xff\xfe\xc3(", "n_predict": 2}')),
        ("invalid UTF-8 chat message", post("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xc3\x28\xa0"}], "max_tokens": 2}')),
        ("huge n_predict", post("/completion", json.dumps({"prompt": "hi", "n_predict": 2**31 - 1}), timeout=300)),
        ("negative max_tokens", post("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}))),
        ("messages is a string", post("/v1/chat/completions", json.dumps({"messages": "hello"}))),
        ("max_tokens is a string", post("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}))),
        ("temperature is a string", post("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 2, "temperature": "hot"}))),
        ("prompt is an object", post("/completion", json.dumps({"prompt": {"a": 1}, "n_predict": 2}))),
        ("token ids out of vocabulary", post("/completion", json.dumps({"prompt": [10**9, -5], "n_predict": 2}))),
        ("200 idle connections", idle),
    ]


def http_bad_inputs(model: Path, home: Path, only: list[str] | None = None, ctx_size: int = 1024) -> list[dict[str, Any]]:
    rows = []
    with detached(model, home, "http", "--ctx-size", str(ctx_size)) as srv:
        first_pid = srv.state["server_pid"]
        for name, send in http_cases():
            if only and name not in only:
                continue
            started = time.monotonic()
            try:
                answer = send(srv.url)
            except httpx.HTTPError as exc:
                answer = f"{type(exc).__name__}"
            seconds = time.monotonic() - started
            state = srv.refresh()
            rows.append({"case": name, "answer": answer, "seconds": round(seconds, 2), "health": srv.healthy(),
                         "restarts": state.get("restarts"), "same_pid": state.get("server_pid") == first_pid})
    return rows


# --- 3. load ----------------------------------------------------------------------------------------------


def load(model: Path, home: Path, *, clients: int = 32, waves: int = 3, max_tokens: int = 32) -> dict[str, Any]:
    """``clients`` concurrent streaming chat requests through the openai package, ``waves`` times."""
    from openai import OpenAI

    with detached(model, home, "load") as srv:
        api = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
        ttfts: list[float] = []
        tokens = 0
        failures: list[str] = []
        wall = 0.0
        lock = threading.Lock()

        def one(i: int) -> None:
            nonlocal tokens
            started = time.perf_counter()
            first = None
            n = 0
            try:
                stream = api.chat.completions.create(model="m", messages=[{"role": "user", "content": f"tell me about {i}"}],
                                                     max_tokens=max_tokens, stream=True, temperature=0.7)
                for chunk in stream:
                    delta = chunk.choices[0].delta if chunk.choices else None
                    # the DeepSeek-V4 template streams thinking as reasoning_content: text all the same
                    if delta and (delta.content or (delta.model_extra or {}).get("reasoning_content")):
                        first = first or time.perf_counter()
                        n += 1
                with lock:
                    if first is None:
                        failures.append(f"client {i}: no content")
                    else:
                        ttfts.append(first - started)
                        tokens += n
            except Exception as exc:  # recorded: the figure is the failure count
                with lock:
                    failures.append(f"client {i}: {type(exc).__name__}: {exc}")

        for _ in range(waves):
            threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            wall += time.perf_counter() - started
        state = srv.refresh()
        q = statistics.quantiles(ttfts, n=100) if len(ttfts) >= 2 else [float("nan")] * 99
        return {"clients": clients, "waves": waves, "requests": clients * waves, "failures": len(failures),
                "failure_examples": failures[:3], "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
                "ttft_p99_s": round(q[98], 3), "tokens": tokens, "aggregate_tokens_per_s": round(tokens / wall, 1),
                "restarts": state.get("restarts"), "max_tokens": max_tokens}


# --- 4. faults -------------------------------------------------------------------------------------------------


def _wait(predicate: Callable[[], Any], timeout: float, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


def kill_llama_server(model: Path, home: Path, restart: int = 2) -> dict[str, Any]:
    """kill -9 llama-server until the restart limit is used up; the entry stays listed as failed."""
    times = []
    with detached(model, home, "crashy", "--restart", str(restart)) as srv:
        for _ in range(restart):
            pid = srv.state["server_pid"]
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            back = _wait(lambda: srv.refresh().get("status") == "ready" and srv.state.get("server_pid") != pid and srv.healthy(), 120)
            times.append(round(time.monotonic() - killed, 2) if back else None)
        os.kill(srv.state["server_pid"], signal.SIGKILL)
        failed = _wait(lambda: srv.refresh().get("status") == "failed" and not psutil.pid_exists(srv.state["supervisor_pid"]), 60)
        ps = pyllm("ps", "--json", home=home)
        listed = [e for e in json.loads(ps.stdout or "[]") if e["name"] == srv.name]
        logs = pyllm("logs", srv.name, home=home)
        events = (home / "servers" / srv.name / "events.log").read_text()
        row = {"restart_limit": restart, "restart_seconds": times, "restarts": srv.state.get("restarts"),
               "after_limit": srv.state.get("status") if failed else "not failed",
               "listed_after_failure": bool(listed) and listed[0]["status"] == "failed",
               "reason": (listed[0].get("error") if listed else None), "logs_rc": logs.returncode,
               "events_deaths": events.count(" died ("), "events_tail": events.strip().splitlines()[-1] if events.strip() else ""}
        stop = pyllm("stop", srv.name, home=home)
        row["stop_removes_it"] = stop.returncode == 0 and not json.loads(pyllm("ps", "--json", home=home).stdout)
        return row


def kill_with_restart_zero(model: Path, home: Path) -> dict[str, Any]:
    with detached(model, home, "once", "--restart", "0") as srv:
        os.kill(srv.state["server_pid"], signal.SIGKILL)
        _wait(lambda: srv.refresh().get("status") == "failed", 30)
        _wait(lambda: not psutil.pid_exists(srv.state["supervisor_pid"]), 30)
        events = (home / "servers" / srv.name / "events.log").read_text()
        listed = json.loads(pyllm("ps", "--json", home=home).stdout or "[]")
        return {"status": srv.state.get("status"), "events_record_death": "died (" in events and "SIGKILL" in events,
                "listed": [e["status"] for e in listed], "logs_rc": pyllm("logs", srv.name, home=home).returncode}


def kill_supervisor(model: Path, home: Path) -> dict[str, Any]:
    with detached(model, home, "orphan") as srv:
        child = psutil.Process(srv.state["server_pid"])
        killed = time.monotonic()
        os.kill(srv.state["supervisor_pid"], signal.SIGKILL)
        gone = _wait(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, 30)
        seconds = round(time.monotonic() - killed, 2)
        ps = pyllm("ps", home=home)
        return {"llama_server_gone": bool(gone), "seconds": seconds, "ps_line": one_line(ps), "ps_rc": ps.returncode}


def foreground_signal(model: Path, home: Path, sig: signal.Signals) -> dict[str, Any]:
    proc = subprocess.Popen([str(PYLLM), "serve", str(model), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYLLM_HOME=str(home)))
    try:
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"foreground serve did not get ready: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}")
        children = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "llama-server"]
        sent = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        gone, alive = psutil.wait_procs(children, timeout=15)
        return {"signal": sig.name, "rc": rc, "children": len(children), "children_left": len(alive),
                "seconds": round(time.monotonic() - sent, 2),
                "state_left": any((home / "servers").rglob("state.json")) if (home / "servers").exists() else False}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def corrupt_state(home: Path) -> list[dict[str, Any]]:
    """state.json as bytes, a list, a string, a number, and a forged PID: ps and stop --all stay one-liners."""
    rows = []
    variants = {"random bytes": b"\x00\xff\x13garbage", "a JSON list": b"[1, 2]", "a JSON string": b'"ready"',
                "a JSON number": b"42", "an object with wrong types": b'{"supervisor_pid": "x", "started_at": [], "status": 3}'}
    for label, data in variants.items():
        directory = home / "servers" / "bad"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "state.json").write_bytes(data)
        ps = pyllm("ps", home=home)
        (directory / "state.json").write_bytes(data)
        stop = pyllm("stop", "--all", home=home)
        rows.append({"state": label, "ps_rc": ps.returncode, "ps_line": one_line(ps), "stop_all_rc": stop.returncode,
                     "traceback": "Traceback" in ps.stderr + stop.stderr})
    return rows


def stop_never_signals_strangers(home: Path) -> list[dict[str, Any]]:
    """A hand-written state.json naming a process that is not ours: stop --all must leave it alone."""
    rows = []
    for label in ("future started_at", "matching started_at, other command line"):
        with _unrelated_process() as proc:
            started = psutil.Process(proc.pid).create_time()
            directory = home / "servers" / "forged"
            directory.mkdir(parents=True, exist_ok=True)
            data = {"name": "forged", "status": "ready", "supervisor_pid": proc.pid,
                    "started_at": time.time() + 3600 if label.startswith("future") else started, "cmdline_sha256": "0" * 64}
            (directory / "state.json").write_text(json.dumps(data))
            stop = pyllm("stop", "--all", home=home)
            time.sleep(0.3)
            rows.append({"forged": label, "stop_rc": stop.returncode, "line": one_line(stop), "process_alive": proc.poll() is None})
    return rows


def disk_full_synth(size: str = "200m") -> dict[str, Any]:
    """synth into a tmpfs that another writer fills right after synth's space check: ENOSPC mid-write."""
    try:
        with tmpfs(size) as fs:
            filler_done = threading.Event()

            synth_done = threading.Event()

            def fill() -> None:  # wait for synth's temporary folder, then take every free byte
                while not synth_done.is_set() and not any(p.name.startswith(".x.synth-") for p in fs.iterdir()):
                    time.sleep(0.001)
                if synth_done.is_set():
                    return
                with contextlib.suppress(OSError), open(fs / "filler", "wb") as f:
                    while True:
                        f.write(b"\0" * (1 << 20))
                filler_done.set()

            t = threading.Thread(target=fill, daemon=True)
            t.start()
            result = pyllm("synth", "tiny-deepseek4", "--type", "f32", "-o", str(fs / "x.gguf"), home=fs / ".home-unused")
            synth_done.set()
            t.join(timeout=60)
            left = sorted(p.name for p in fs.iterdir() if p.name not in ("filler", ".home-unused"))
            return {"rc": result.returncode, "line": one_line(result), "left_behind": left, "filled": filler_done.is_set(),
                    "traceback": "Traceback" in result.stderr}
    except Unavailable as exc:
        return {"skipped": str(exc)}


def disk_full_fetch(shard_files: dict[str, bytes], home: Path, size: str = "20m") -> dict[str, Any]:
    """fetch into a 20 MiB tmpfs while the hub lists sizes that fit: the disk fills mid-file."""
    sys.path.insert(0, str(HERE))
    from hub import HubFile

    try:
        with tmpfs(size) as fs, contextlib.ExitStack() as stack:
            files = {k: HubFile(v, listed_size=1 << 20) if k.endswith(".gguf") else v for k, v in shard_files.items()}
            env = _hub_env(stack, fs.parent / f"{fs.name}-hf", files=files)
            result = pyllm("fetch", REPO, "--include", "UD-Q8_K_XL/*", "--local-dir", str(fs / "m"), "--workers", "1",
                           home=home, env=env, timeout=300)
            complete = [str(p.relative_to(fs / "m")) for p in (fs / "m").rglob("*.gguf")] if (fs / "m").exists() else []
            intact = all((fs / "m" / n).read_bytes() == shard_files[n] for n in complete)
            return {"rc": result.returncode, "line": one_line(result), "files_under_final_names": complete, "intact": intact,
                    "manifest": (fs / "m" / ".pyllm-manifest.json").exists(), "traceback": "Traceback" in result.stderr}
    except Unavailable as exc:
        return {"skipped": str(exc)}


def dropped_connection(shard_files: dict[str, bytes], home: Path, persistent: bool) -> dict[str, Any]:
    """The loopback hub cuts a shard mid-file: once (resumed with a Range request) or on every attempt."""
    sys.path.insert(0, str(HERE))
    from hub import HubFile

    name = next(k for k in shard_files if k.endswith("00002-of-00003.gguf"))
    files = dict(shard_files)
    files[name] = HubFile(files[name], cut_after=11 << 20, cut_always=persistent)
    with contextlib.ExitStack() as stack:
        env = _hub_env(stack, home.parent / f"{home.name}-hf", files=files)
        root = home / "dl"
        result = pyllm("fetch", REPO, "--include", "UD-Q8_K_XL/*", "--local-dir", str(root), "--workers", "1",
                       home=home, env=env, timeout=300)
        whole = {str(p.relative_to(root)) for p in root.rglob("*.gguf")}
        intact = all((root / n).read_bytes() == shard_files[n] for n in whole)
        return {"cut": "every attempt" if persistent else "once", "rc": result.returncode, "line": one_line(result),
                "complete_files": len(whole), "all_complete_files_intact": intact,
                "manifest": (root / ".pyllm-manifest.json").exists(), "traceback": "Traceback" in result.stderr}


# --- 5. security ----------------------------------------------------------------------------------------------------


def raw_post(port: int, path: str, body: str, authorization: str | None) -> int:
    """POST over a plain socket: HTTP clients refuse header values such as "Bearer " that attackers send."""
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nConnection: close\r\n"
    if authorization is not None:
        head += f"Authorization: {authorization}\r\n"
    data = body.encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head.encode() + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        status = s.makefile("rb").readline().decode()
    return int(status.split()[1])


def key_required(model: Path, home: Path) -> dict[str, Any]:
    """Off loopback: empty and blank keys refused; no key -> one generated and enforced; never in argv, logs, state."""
    row: dict[str, Any] = {}
    for label, key in (("empty", ""), ("spaces", "   "), ("newline", "\n")):
        r = pyllm("serve", str(model), "--host", "0.0.0.0", "--port", "0", "--api-key", key, "--detach", home=home)
        row[f"key {label}"] = {"rc": r.returncode, "line": one_line(r), "state_left": bool(list((home / "servers").glob("*/state.json"))) if (home / "servers").exists() else False}
    r = pyllm("serve", str(model), "--host", "0.0.0.0", "--port", "0", "--detach", "--name", "open", home=home, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    try:
        key = next(line for line in r.stdout.splitlines() if line.startswith("API key")).rsplit(" ", 1)[1]
        state = json.loads((home / "servers" / "open" / "state.json").read_text())
        probes = {"no key": None, "wrong key": "Bearer wrong", "empty bearer": "Bearer ", "bearer of spaces": "Bearer    ",
                  "the key": f"Bearer {key}"}
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        row["requests"] = {label: raw_post(state["port"], "/v1/chat/completions", body, auth) for label, auth in probes.items()}
        places = []
        for p in psutil.process_iter(["cmdline", "environ"]):
            with contextlib.suppress(psutil.Error):
                if key in " ".join(p.info["cmdline"] or []):
                    places.append(f"argv of PID {p.pid}")
        for f in (home / "servers" / "open").iterdir():
            if f.name != "api_key" and f.is_file() and key in f.read_text(errors="replace"):
                places.append(f.name)
        row["key_found_in"] = places
        row["key_file_mode"] = oct((home / "servers" / "open" / "api_key").stat().st_mode & 0o777)
    finally:
        pyllm("stop", "open", home=home)
    return row


def file_modes(model: Path, home: Path) -> dict[str, str]:
    """Modes of the state tree of a running detached server (PYLLM_HOME created by pyllm)."""
    with detached(model, home, "modes") as srv:
        directory = home / "servers" / srv.name
        paths = [home, home / "servers", directory] + sorted(p for p in directory.iterdir() if p.is_file())
        return {("PYLLM_HOME" if p == home else str(p.relative_to(home)) + ("/" if p.is_dir() else "")): oct(p.stat().st_mode & 0o777)
                for p in paths}


def cors(model: Path, home: Path) -> list[dict[str, Any]]:
    """Access-Control-Allow-Origin for the origin users are told to use, loopback forms and a foreign page."""
    from pyllm_a100 import Server

    rows = []
    for host in ("127.0.0.1", "localhost", "0.0.0.0"):
        key = "k" * 24 if host == "0.0.0.0" else None
        with Server(model, host=host, port=0, api_key=key, log_path=home / f"cors-{host}.log", ready_timeout=300) as srv:
            told = srv.config.public_url
            port = srv.config.port
            origins = {"the URL users are told": told, "http://127.0.0.1:PORT": f"http://127.0.0.1:{port}",
                       "http://localhost:PORT": f"http://localhost:{port}", "a foreign page": "http://evil.example"}
            answers, allowed = {}, {}
            for label, origin in origins.items():
                r = httpx.options(srv.base_url + "/v1/chat/completions", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}, timeout=30)
                answers[label] = r.headers.get("access-control-allow-origin")
                allowed[label] = answers[label] in (origin, "*")  # what a browser concludes
            rows.append({"bind": host, "told": told, "allow_origin": answers, "allowed": allowed})
    return rows
