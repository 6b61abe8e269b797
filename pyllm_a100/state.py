"""Managed servers on disk: ``$PYLLM_HOME/servers/NAME/`` holds state.json, server.log, api_key.

state.json is replaced atomically (write a temporary file, rename); an entry whose
process is gone is stale and removed by :func:`list_servers`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import psutil

from .errors import ServerNotFound

STATE = "state.json"


def home() -> Path:
    return Path(os.environ.get("PYLLM_HOME") or Path.home() / ".cache" / "pyllm-a100").expanduser()


def servers_dir() -> Path:
    return home() / "servers"


def write_json_atomic(path: Path, data: dict[str, Any], mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_secret(path: Path, text: str) -> Path:
    """A file only its owner can read (mode 0600 from creation, not chmod afterwards)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
    return path


@dataclasses.dataclass
class ServerEntry:
    name: str
    directory: Path
    data: dict[str, Any]

    @property
    def pid(self) -> int:
        return int(self.data.get("supervisor_pid", 0))

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def alive(self) -> bool:
        """The pyllm process that owns this server still runs (not a recycled PID)."""
        try:
            proc = psutil.Process(self.pid)
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= float(self.data.get("started_at", 0)) + 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            return False


def valid_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise ServerNotFound(f"server name {name!r} must be letters, digits, '.', '_' or '-' (up to 64)")
    return name


def new_server_dir(base_name: str) -> Path:
    """A fresh folder for a server called ``base_name`` (or base_name-2, -3...)."""
    root = servers_dir()
    root.mkdir(parents=True, exist_ok=True)
    clean = re.sub(r"[^A-Za-z0-9._-]", "-", base_name)[:48] or "server"
    list_servers()  # drop stale entries first so their names are free again
    for i in range(1, 1000):
        name = clean if i == 1 else f"{clean}-{i}"
        directory = root / name
        try:
            directory.mkdir()
            return directory
        except FileExistsError:
            if not (directory / STATE).exists() and not any(directory.glob("*.lock")):
                return directory
    raise ServerNotFound(f"too many servers named {clean}: stop some (pyllm stop --all)")


def save(directory: Path, data: dict[str, Any]) -> None:
    write_json_atomic(directory / STATE, data)


def update(directory: Path, **changes: Any) -> None:
    path = directory / STATE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data.update(changes)
    save(directory, data)


def list_servers(clean: bool = True) -> tuple[list[ServerEntry], list[str]]:
    """Live servers, and the names of stale entries that were cleaned up."""
    live, stale = [], []
    root = servers_dir()
    if not root.is_dir():
        return [], []
    for directory in sorted(root.iterdir()):
        path = directory / STATE
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        entry = ServerEntry(directory.name, directory, data)
        if entry.alive():
            live.append(entry)
        else:
            stale.append(entry.name)
            if clean:
                with contextlib.suppress(OSError):
                    path.unlink()
    return live, stale


def find(name: str | None) -> ServerEntry:
    live, _ = list_servers()
    if name is None:
        if len(live) == 1:
            return live[0]
        if not live:
            raise ServerNotFound("no managed server is running: start one with `pyllm serve MODEL --detach`")
        raise ServerNotFound(f"{len(live)} servers are running ({', '.join(e.name for e in live)}): name one")
    for entry in live:
        if entry.name == name:
            return entry
    names = ", ".join(e.name for e in live) or "none"
    raise ServerNotFound(f"no managed server named {name!r} (running: {names}): see `pyllm ps`")


def stop(entry: ServerEntry, timeout: float = 30.0) -> bool:
    """SIGTERM the owning pyllm process (it stops llama-server cleanly); KILL if it hangs."""
    try:
        proc = psutil.Process(entry.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    except psutil.NoSuchProcess:
        pass
    server_pid = int(entry.data.get("server_pid") or 0)
    if server_pid:
        deadline = time.monotonic() + 10
        while psutil.pid_exists(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    with contextlib.suppress(OSError):
        (entry.directory / STATE).unlink()
    return True
