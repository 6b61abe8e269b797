"""`pyllm serve` and `pyllm rpc-worker` as a library: one launch, prepared once, run with its state folder.

:func:`prepare` resolves a serve request once (resolve.py), creates its folder and API key file and writes
request.json (persist.py): the :class:`Launch` the CLI, the detached supervisor and a systemd unit's foreground
serve all run. Foreground: this process owns the child (llama-server or rpc-server; it dies with us, even on
SIGKILL) and stops it on SIGINT/SIGTERM. Detached: a new session runs ``pyllm _supervise DIR``, which owns the
child the same way and restarts it when it dies; the caller returns once ready. Both show in `pyllm ps`.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import home as files
from ..errors import InvalidArgument, ServerDied, ServerError
from ..process.child import ManagedProcess
from ..process.net import is_loopback
from ..rpc import worker as rpc_worker
from ..rpc.worker import RpcWorker, WorkerOptions
from . import persist, state
from .config import ServerConfig
from .options import ServeOptions
from .resolve import resolve
from .server import LoadProgress, Server
from .validate import check_name


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch, resolved: what runs (a server's config or a worker's options), its state folder, its restart
    limit and, for a server, the API key file llama-server enforces (the request's, or the one serve wrote)."""

    directory: Path
    target: ServerConfig | WorkerOptions
    restart_limit: int
    key_file: Path | None = None
    generated_key: str | None = dataclasses.field(default=None, repr=False)  # shown once to the user, never saved
    shown: dict[str, Any] | None = dataclasses.field(default=None, compare=False)  # view(), as request.json holds it

    @property
    def kind(self) -> str:
        return "rpc-worker" if isinstance(self.target, WorkerOptions) else "server"

    def make_process(self, **callbacks: Any) -> ManagedProcess:
        log_path = self.directory / "server.log"
        if isinstance(self.target, WorkerOptions):
            callbacks.pop("on_progress", None)
            return RpcWorker(self.target, log_path=log_path, restart=self.restart_limit, **callbacks)
        return Server(config=self.target, key_file=self.key_file, log_path=log_path, restart=self.restart_limit,
                      **callbacks)

    def view(self) -> dict[str, Any]:
        """What `pyllm ps` shows of it, computed once (persist.py keeps it in request.json)."""
        if self.shown is not None:
            return self.shown
        if isinstance(self.target, WorkerOptions):
            return {"kind": "rpc-worker", "host": self.target.host, "port": self.target.port,
                    "url": f"rpc://{self.target.endpoint}", "model": f"devices: {self.target.device or 'all'}",
                    "restart_limit": self.restart_limit}
        cfg = self.target
        return {"kind": "server", "host": cfg.host, "port": cfg.port, "url": cfg.public_url,
                "model": str(cfg.model.first), "served_name": cfg.served_name,
                "api_key_file": str(self.key_file) if self.key_file else None,
                "draft": cfg.draft.describe() if cfg.draft is not None else None,
                "gpus": list(cfg.gpus) if cfg.gpus is not None else cfg.gpus_used, "gpus_given": cfg.gpus is not None,
                "metrics": f"{cfg.public_url}/metrics" if cfg.metrics else None,
                "service": os.environ.get("PYLLM_SERVICE"),  # the systemd unit running it (pyllm service install)
                "options": _public_options(cfg), "restart_limit": self.restart_limit,
                "plan": cfg.capacity.as_dict() if cfg.capacity is not None else None,
                "devices": cfg.device_plan()}

    def save(self) -> None:
        """request.json: the request as asked, what it resolved to, and the view."""
        if isinstance(self.target, WorkerOptions):
            persist.write_request(self.directory, self.kind, self.target.public(), {}, self.view())
            return
        resolved = {**persist.config_json(self.target), "restart_limit": self.restart_limit,
                    "key_file": str(self.key_file) if self.key_file else None}
        persist.write_request(self.directory, self.kind, _public_options(self.target), resolved, self.view())

    @classmethod
    def load(cls, directory: Path) -> Launch:
        """The launch request.json holds (the supervisor's): nothing resolved again."""
        data = persist.read_request(directory)
        target = persist.target_of(data)
        if isinstance(target, WorkerOptions):
            return cls(directory, target, data["view"]["restart_limit"], shown=data["view"])
        key_file = data["resolved"].get("key_file")
        return cls(directory, target, data["resolved"]["restart_limit"], Path(key_file) if key_file else None,
                   shown=data["view"])


def _public_options(config: ServerConfig) -> dict[str, Any]:
    """The request as asked (no secret), its model as the path it was found at (a relative path or a hub name)."""
    return {**config.options.public(), "model": str(config.model.first)}


def prepare(options: ServeOptions) -> Launch:
    """Resolve the request once (resolve.py: every check first, its paths made absolute), then create its state
    folder with the API key file if any, and write request.json. Nothing is written before every check has passed."""
    config = resolve(options, require_api_key=False)  # a key file is written below when one is needed
    api_key = options.api_key
    generated = None
    if api_key is None and config.api_key_file is None and not is_loopback(config.host):
        api_key = generated = secrets.token_urlsafe(32)
    # an explicit --name takes over a failed entry of that name (a systemd restart keeps its name)
    directory = state.new_server_dir(options.name or f"{config.model.name}-{config.port}",
                                     reuse_failed=options.name is not None, exact=options.name is not None)
    written = files.write_secret(directory / "api_key", api_key) if api_key is not None else None
    launch = Launch(directory, config, options.restarts, written or config.api_key_file, generated)
    launch = dataclasses.replace(launch, shown=launch.view())
    launch.save()
    return launch


def prepare_worker(options: WorkerOptions) -> Launch:
    """A worker's launch: its options checked (the loopback rule, the port) before its folder is made."""
    if options.restarts < 0:
        raise InvalidArgument(f"--restart {options.restart}: must be 0 (never restart) or a number of restarts (default: 3 detached)")
    if options.name is not None:
        check_name(options.name)
    rpc_worker.check(options)
    directory = state.new_server_dir(options.name or f"rpc-worker-{options.port}", exact=options.name is not None)
    launch = Launch(directory, dataclasses.replace(options, name=directory.name), options.restarts)
    launch = dataclasses.replace(launch, shown=launch.view())
    launch.save()
    return launch


def overlapping(launch: Launch) -> list[tuple[str, list[int]]]:
    """Other running servers sharing a GPU with this one: (name, the GPUs shared). Two llama-servers on
    one GPU split its memory and its compute; `pyllm serve` warns, it does not refuse."""
    mine = set(launch.view().get("gpus") or [])
    found = []
    for entry in state.list_servers(clean=False)[0] if mine else []:
        if entry.name == launch.directory.name or entry.failed:
            continue
        theirs = entry.data.get("gpus")
        shared = sorted(mine & set(theirs)) if isinstance(theirs, list) else []
        if shared:
            found.append((entry.name, shared))
    return found


class _Terminate(Exception):
    pass


def run(
    launch: Launch,
    *,
    on_progress: Callable[[LoadProgress], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    on_ready: Callable[[ManagedProcess], None] | None = None,
) -> int:
    """Run the child until it ends or we are told to stop (SIGINT/SIGTERM); exit status for the CLI."""
    live = state.Live(launch.directory, launch.view())
    child: ManagedProcess | None = None

    def progress(p: LoadProgress) -> None:
        if p.phase == "ready":
            live.update(load_seconds=round(p.seconds, 3), ready_since=time.time())
        live.save_progress(child, p)
        if on_progress:
            on_progress(p)

    def event(message: str) -> None:
        files.append_line(launch.directory / "events.log", f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}")
        if child is not None and child.status == "restarting":
            live.update(last_restart_reason=child.last_exit, last_restart_at=time.time())
        if child is not None and child.status in ("ready", "restarting", "failed"):
            extra = {"error": child.last_exit} if child.status == "failed" else {}
            live.save(child, child.status, last_exit=child.last_exit, **extra)
        if on_event and not (child is not None and child.status == "failed"):
            on_event(message)  # the final death is raised as the one-line error instead

    def terminate(signum: int, frame: Any) -> None:
        raise _Terminate()

    previous = signal.signal(signal.SIGTERM, terminate)
    child = launch.make_process(on_progress=progress, on_event=event)
    live.save(child, "starting")
    try:
        try:
            child.start()
        except ServerError as exc:
            files.append_line(launch.directory / "events.log", f"{time.strftime('%Y-%m-%d %H:%M:%S')} {child.name} failed to start: {exc}")
            live.save(child, "failed", error=str(exc))
            raise
        live.save(child, "ready")
        if on_ready:
            on_ready(child)
        code = child.wait()
        reason = child.last_exit or child.explain(code)
        live.save(child, "failed", error=reason)
        raise ServerDied(reason)
    except (KeyboardInterrupt, _Terminate):
        return 0
    finally:
        # a second SIGTERM or Ctrl-C while llama-server is being stopped must not cut the stop short with a
        # traceback (systemd, `timeout`, an impatient operator): the stop is bounded (TERM, then KILL)
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            child.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
        live.clear_unless_failed()


def start_detached(launch: Launch) -> subprocess.Popen[bytes]:
    """Start ``pyllm _supervise DIR`` in its own session; it outlives this process."""
    with files.open_private(launch.directory / "supervisor.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pyllm_a100", "_supervise", str(launch.directory)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            cwd="/",
        )


def wait_detached(launch: Launch, proc: subprocess.Popen[bytes],
                  on_progress: Callable[[LoadProgress], None] | None = None) -> dict[str, Any]:
    """Follow the supervisor's state.json until ready (return it) or failed (raise)."""
    path = launch.directory / state.STATE
    while True:
        data = state.read_state(path)
        status = data.get("status")
        if data.get("supervisor_pid") == proc.pid:
            if status == "ready":
                if not data.get("progress") and data.get("load_seconds") is not None:
                    data["progress"] = {"seconds": data["load_seconds"]}
                return data
            if status == "failed":
                raise ServerDied(data.get("error", "llama-server failed"))
            if on_progress and data.get("progress"):
                p = data["progress"]
                on_progress(LoadProgress(p["phase"], p["loaded"], p["total"], p["seconds"]))
        code = proc.poll()
        if code is not None:
            log = launch.directory / "supervisor.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise ServerDied(f"the detached supervisor exited ({code}) before it was ready: {' '.join(tail)}")
        time.sleep(0.25)


def supervise(directory: Path) -> int:
    """Entry point of the detached supervisor (``pyllm _supervise DIR``)."""
    try:
        return run(Launch.load(directory), on_event=lambda m: print(m, flush=True))
    except ServerError as exc:
        print(f"error: {exc}", flush=True)
        return 1
