"""Managed servers on disk: ``$PYLLM_HOME/servers/NAME/`` holds request.json, state.json, server.log, api_key.

request.json is written once, when the launch is prepared (persist.py); state.json records what changes while it
runs (:class:`Live`: status, PIDs, restarts so far, load progress and figures) and where it listens, nothing else.

The tree is private: folders 0700, files 0600 (logs hold prompts; the key file is a
secret), as ssh and huggingface_hub's token do. state.json is replaced atomically (write
a temporary file, rename). An entry is *ours* only while the recorded supervisor PID runs
with the recorded start time and command line; otherwise it is stale and removed by
:func:`list_servers` -- except a server that failed, which stays listed (``failed``, with
its reason and logs) until ``pyllm stop NAME`` or ``pyllm ps --prune``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from ..errors import ServerNotFound, StateError
from ..home import PRIVATE_DIR, PRIVATE_FILE, private_dir, servers_dir, write_json_atomic
from .validate import NAME

STATE = "state.json"
REQUEST = "request.json"


def read_state(path: Path) -> dict[str, Any]:
    """state.json as a dict; anything unreadable (bytes, a list, a string, a missing file) is ``{}``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cmdline_digest(cmdline: list[str]) -> str:
    """What identifies the process we started without storing its argv (which may hold an --api-key)."""
    return hashlib.sha256("\0".join(cmdline).encode(errors="replace")).hexdigest()


def owner_record() -> dict[str, Any]:
    """This process's identity, recorded in state.json: PID, start time and command line digest."""
    me = psutil.Process()
    return {"supervisor_pid": me.pid, "started_at": me.create_time(), "cmdline_sha256": cmdline_digest(me.cmdline())}


def read_view(directory: Path) -> dict[str, Any]:
    """What `pyllm ps` shows of a launch, as request.json recorded it once (``{}`` when there is none)."""
    view = read_state(directory / REQUEST).get("view")
    return view if isinstance(view, dict) else {}


@dataclasses.dataclass
class ServerEntry:
    """One listed server or worker; ``data`` is its launch's view (request.json) with the live state over it."""

    name: str
    directory: Path
    data: dict[str, Any]

    @property
    def pid(self) -> int:
        try:
            return int(self.data.get("supervisor_pid") or 0)
        except (TypeError, ValueError):
            return 0

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def failed(self) -> bool:
        return self.data.get("status") == "failed"

    def alive(self) -> bool:
        """The pyllm process that owns this server still runs: same PID, start time and command line."""
        return self.process() is not None

    def process(self) -> psutil.Process | None:
        """The owning process, only when it is the one we started (never a recycled or forged PID)."""
        if self.pid <= 1 or self.pid == os.getpid():
            return None
        try:
            started = float(self.data.get("started_at"))
            proc = psutil.Process(self.pid)
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            if abs(proc.create_time() - started) > 1.0:
                return None
            digest = self.data.get("cmdline_sha256")
            if digest != cmdline_digest(proc.cmdline()):
                return None
            return proc
        except (psutil.Error, TypeError, ValueError):
            return None


def valid_name(name: str) -> str:
    """A server's name as `pyllm stop`, logs and the units take it (validate.NAME)."""
    if not NAME.fullmatch(name):
        raise ServerNotFound(f"server name {name!r} must be letters, digits, '.', '_' or '-' (up to 64)")
    return name


def new_server_dir(base_name: str, reuse_failed: bool = False, exact: bool = False) -> Path:
    """A fresh folder for a server called ``base_name`` (or base_name-2, -3...), mode 0700.

    ``exact``: ``base_name`` is the user's (checked by validate.check_name) and kept whole; a name made
    from the model's is cleaned and cut to 48 characters.
    ``reuse_failed``: a failed entry called exactly ``base_name`` is taken over (its logs are appended to),
    so a server restarted under its own name (a systemd unit's) keeps that name."""
    root = private_dir(servers_dir())
    clean = base_name if exact else re.sub(r"[^A-Za-z0-9._-]", "-", base_name)[:48].lstrip(".-_") or "server"
    list_servers()  # drop stale entries first so their names are free again
    for i in range(1, 1000):
        name = clean if i == 1 else f"{clean}-{i}"
        directory = root / name
        try:
            directory.mkdir(mode=PRIVATE_DIR)
            return directory
        except FileExistsError:
            if directory.is_dir() and not (directory / STATE).exists() and not any(directory.glob("*.lock")):
                return private_dir(directory)
            if reuse_failed and i == 1 and directory.is_dir():
                entry = ServerEntry(name, directory, read_state(directory / STATE))
                if entry.failed and not entry.alive():
                    return private_dir(directory)
        except OSError as exc:
            raise StateError(f"cannot create {directory} ({exc.strerror}): make {root} writable, or point PYLLM_HOME elsewhere") from exc
    raise ServerNotFound(f"too many servers named {clean}: stop some (pyllm stop --all)")


def save(directory: Path, data: dict[str, Any]) -> None:
    write_json_atomic(directory / STATE, data, mode=PRIVATE_FILE)


class Live:
    """state.json of one running launch: what changes (status, PIDs, restarts so far, progress, figures such as
    load_seconds), and where it listens (kind, port, url); written atomically, load progress at most twice a second."""

    def __init__(self, directory: Path, view: dict[str, Any]) -> None:
        self.directory = directory
        self.address = {key: view.get(key) for key in ("kind", "port", "url")}
        self.figures: dict[str, Any] = {}  # kept in every write: load_seconds, ready_since, last_restart_reason, ...
        self._saved = 0.0

    def update(self, **figures: Any) -> None:
        self.figures.update(figures)

    def save(self, child: Any, status: str, **extra: Any) -> None:
        save(self.directory, {
            "name": self.directory.name,
            "status": status,
            **owner_record(),  # pid, start time, command line digest: `stop` signals only this process
            # None once it has exited: while restarting, ps showed the PID of the llama-server that died
            "server_pid": child.pid if child and child.proc and child.proc.returncode is None else None,
            **self.address,
            "restarts": child.restarts if child else 0,
            "log": str(self.directory / "server.log"),
            **self.figures,
            **extra,
        })
        self._saved = time.monotonic()

    def save_progress(self, child: Any, p: Any) -> None:
        """The load's progress (throttled), or "ready" once it is."""
        if p.phase == "ready" or time.monotonic() - self._saved > 0.5:
            self.save(child, "ready" if p.phase == "ready" else "loading",
                      progress={"phase": p.phase, "loaded": p.loaded, "total": p.total, "seconds": p.seconds})

    def clear_unless_failed(self) -> None:
        """A stopped launch leaves no state.json; a failed one stays listed (ps) until stopped or pruned."""
        if read_state(self.directory / STATE).get("status") != "failed":
            with contextlib.suppress(OSError):
                (self.directory / STATE).unlink()


def _remove(entry: ServerEntry) -> None:
    with contextlib.suppress(OSError):
        (entry.directory / STATE).unlink()


def list_servers(clean: bool = True, prune: bool = False) -> tuple[list[ServerEntry], list[str]]:
    """Running and failed servers, and the names of stale entries that were removed.

    Stale: the owning process is gone (or the PID now belongs to another program) and the
    entry did not record a failure, or its state.json is unreadable. ``prune`` removes
    failed entries too.
    """
    kept, stale = [], []
    root = servers_dir()  # a PYLLM_HOME that is a file is said, not taken for "no servers"
    if not root.is_dir():
        return [], []
    for directory in sorted(root.iterdir()):
        path = directory / STATE
        if not path.is_file():
            continue
        live = read_state(path)
        entry = ServerEntry(directory.name, directory, {**read_view(directory), **live} if live else {})
        if entry.alive():
            kept.append(entry)
        elif entry.failed and not prune:
            kept.append(entry)
        else:
            stale.append(entry.name)
            if clean:
                _remove(entry)
    return kept, stale


def find(name: str | None) -> ServerEntry:
    entries, _ = list_servers()
    if name is None:
        if len(entries) == 1:
            return entries[0]
        if not entries:
            raise ServerNotFound("no managed server is running: start one with `pyllm serve MODEL --detach`")
        raise ServerNotFound(f"{len(entries)} servers are listed ({', '.join(e.name for e in entries)}): name one")
    for entry in entries:
        if entry.name == name:
            return entry
    names = ", ".join(e.name for e in entries) or "none"
    raise ServerNotFound(f"no managed server named {name!r} (listed: {names}): see `pyllm ps`")


def _ended(proc: psutil.Process, timeout: float) -> bool:
    """Whether ``proc`` exits within ``timeout`` s. A zombie has exited: it waits only for its parent to reap it
    (a foreground pyllm serve started by a script that has not waited yet), so it counts as ended."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop(entry: ServerEntry, timeout: float = 30.0) -> bool:
    """SIGTERM the owning pyllm process (it stops llama-server cleanly); KILL if it hangs.

    Only a process that is provably ours (PID, start time and command line as recorded) is
    signalled; a failed or stale entry is just removed. True when a process was stopped.
    """
    proc = entry.process()
    if proc is not None:
        try:
            proc.send_signal(signal.SIGTERM)
            if not _ended(proc, timeout):
                proc.kill()
                _ended(proc, 10)
        except psutil.NoSuchProcess:
            pass
        try:
            server_pid = int(entry.data.get("server_pid") or 0)
        except (TypeError, ValueError):
            server_pid = 0
        if server_pid:
            deadline = time.monotonic() + 10
            while psutil.pid_exists(server_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
    _remove(entry)
    return proc is not None
