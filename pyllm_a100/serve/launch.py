"""`pyllm serve` and `pyllm rpc-worker` as a library: one managed process with its state folder.

Foreground: this process owns the child (llama-server or rpc-server; it dies with us,
even on SIGKILL) and stops it on SIGINT/SIGTERM. Detached: a new session runs
``pyllm _supervise DIR`` which owns the child the same way and restarts it when it dies;
the caller returns once ready. Both kinds show in `pyllm ps` and obey `stop`/`logs`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
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
from . import state
from ..errors import InvalidArgument, ServerDied, ServerError
from .net import is_loopback
from .process import ManagedProcess
from .config import ServerConfig, absolute_paths, check_api_key, make_config
from .options import ServeOptions
from .rpc import DEFAULT_PORT as DEFAULT_RPC_PORT
from .rpc import RpcWorker, WorkerConfig
from .server import LoadProgress, Server

LAUNCH = "request.json"  # what a detached supervisor runs: the request, and for a server what it resolved to


@dataclasses.dataclass
class WorkerRequest:
    """What `pyllm rpc-worker` was asked (JSON-serialisable: a detached supervisor runs it)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_RPC_PORT
    devices: str | None = None
    cache: bool = False
    threads: int | None = None
    allow_network: bool = False
    restart: int = 0
    name: str | None = None
    kind: str = "rpc-worker"

    def to_config(self) -> WorkerConfig:
        return WorkerConfig(host=self.host, port=self.port, devices=self.devices, cache=self.cache,
                            threads=self.threads, allow_network=self.allow_network)


@dataclasses.dataclass
class Prepared:
    """One launch, resolved: the config it runs (a server's or a worker's), its state folder and restart limit.
    The CLI, the detached supervisor (from request.json) and a systemd unit's foreground serve all run this."""

    config: ServerConfig | WorkerConfig
    directory: Path
    restarts: int
    worker: WorkerRequest | None = None  # a worker's request (what request.json holds for it)
    generated_key: str | None = None  # shown once to the user, never again
    # kept in every state.json write (pyllm metrics): load_seconds, ready_since, last_restart_reason, ...
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)

    def make_process(self, **callbacks: Any) -> ManagedProcess:
        log_path = self.directory / "server.log"
        if isinstance(self.config, WorkerConfig):
            callbacks.pop("on_progress", None)
            return RpcWorker(self.config, log_path=log_path, restart=self.restarts, **callbacks)
        return Server(config=self.config, log_path=log_path, restart=self.restarts, **callbacks)

    def describe(self) -> dict[str, Any]:
        if isinstance(self.config, WorkerConfig):
            return {"kind": "rpc-worker", "host": self.config.host, "port": self.config.port,
                    "url": f"rpc://{self.config.endpoint}", "model": f"devices: {self.config.devices or 'all'}"}
        cfg = self.config
        return {"kind": "server", "host": cfg.host, "port": cfg.port, "url": cfg.public_url,
                "model": str(cfg.model.first), "served_name": cfg.served_name,
                "api_key_file": str(cfg.api_key_file) if cfg.api_key_file else None,
                "draft": cfg.draft.describe() if cfg.draft is not None else None,
                "gpus": cfg.gpus_used, "gpus_given": cfg.gpus is not None,
                "metrics": f"{cfg.public_url}/metrics" if cfg.metrics else None,
                "service": os.environ.get("PYLLM_SERVICE"),  # the systemd unit running it (pyllm service install)
                "options": cfg.to_json()["options"],
                "plan": cfg.capacity.as_dict() if cfg.capacity is not None else None,
                "devices": cfg.device_plan()}

    def gpus_used(self) -> list[int]:
        """nvidia-smi numbers of the GPUs this server may use: --gpus, else every visible one when it offloads."""
        return list(self.config.gpus_used) if isinstance(self.config, ServerConfig) else []

    def to_json(self) -> dict[str, Any]:
        if self.worker is not None:
            return dataclasses.asdict(self.worker)
        resolved = self.config.to_json()
        # the request as asked (paths made absolute) at the top, as before; what pyllm resolved it to beside it
        return {**resolved.pop("options"), "kind": "server", "restarts": self.restarts, "resolved": resolved}

    @classmethod
    def from_json(cls, data: dict[str, Any], directory: Path) -> Prepared:
        if data.get("kind") == "rpc-worker":
            worker = WorkerRequest(**data)
            return cls(worker.to_config(), directory, worker.restart, worker=worker)
        options = {k: v for k, v in data.items() if k not in ("kind", "restarts", "resolved")}
        return cls(ServerConfig.from_json({**data["resolved"], "options": options}), directory, data["restarts"])


def overlapping(prepared: Prepared) -> list[tuple[str, list[int]]]:
    """Other running servers sharing a GPU with this one: (name, the GPUs shared). Two llama-servers on
    one GPU split its memory and its compute; `pyllm serve` warns, it does not refuse."""
    mine = set(prepared.gpus_used())
    if not mine:
        return []
    found = []
    for entry in state.list_servers(clean=False)[0]:
        if entry.name == prepared.directory.name or entry.failed:
            continue
        theirs = entry.data.get("gpus")
        shared = sorted(mine & set(theirs)) if isinstance(theirs, list) else []
        if shared:
            found.append((entry.name, shared))
    return found


def _check_restart(restart: int) -> None:
    if restart < 0:
        raise InvalidArgument(f"--restart {restart}: must be 0 (never restart) or a number of restarts (default: 3 detached)")


def prepare_worker(request: WorkerRequest) -> Prepared:
    _check_restart(request.restart)
    if request.name is not None:
        state.check_name(request.name)
    config = request.to_config()  # validates (loopback rule, port) before anything is written
    directory = state.new_server_dir(request.name or f"rpc-worker-{config.port}", exact=request.name is not None)
    request = dataclasses.replace(request, name=directory.name)
    return Prepared(config, directory, request.restart, worker=request)


def prepare(options: ServeOptions) -> Prepared:
    """Resolve the request once (config.make_config), then create its state folder (with the API key file if any).

    Paths in the options are made absolute first (a key file, files named after ``--``): a detached supervisor
    runs with cwd ``/`` and must find the same files. Nothing is written before every check has passed.
    """
    _check_restart(options.restarts)
    if options.name is not None:
        state.check_name(options.name)
    api_key = options.api_key
    if api_key is not None:
        check_api_key(api_key)
    key_file = os.path.abspath(os.path.expanduser(options.api_key_file)) if options.api_key_file is not None else None
    options = dataclasses.replace(options, api_key=None, api_key_file=key_file,
                                  extra_args=absolute_paths(options.extra_args))
    config = make_config(options, require_api_key=False)  # a key file is written below when one is needed
    # an explicit --name takes over a failed entry of that name (a systemd restart keeps its name)
    directory = state.new_server_dir(options.name or f"{config.model.name}-{config.port}",
                                     reuse_failed=options.name is not None, exact=options.name is not None)
    generated = None
    if api_key is None and key_file is None and not is_loopback(options.host):
        api_key = generated = secrets.token_urlsafe(32)
    if api_key is not None:
        config.api_key_file = files.write_secret(directory / "api_key", api_key)
    return Prepared(config, directory, options.restarts, generated_key=generated)


def _state_record(prepared: Prepared, server: ManagedProcess | None, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": prepared.directory.name,
        "status": status,
        **state.owner_record(),  # pid, start time, command line digest: `stop` signals only this process
        # None once it has exited: while restarting, ps showed the PID of the llama-server that died
        "server_pid": server.pid if server and server.proc and server.proc.returncode is None else None,
        **prepared.describe(),
        "restart_limit": prepared.restarts,
        "restarts": server.restarts if server else 0,
        "log": str(prepared.directory / "server.log"),
        **prepared.figures,
        **extra,
    }


class _Terminate(Exception):
    pass


def run(
    prepared: Prepared,
    *,
    on_progress: Callable[[LoadProgress], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    on_ready: Callable[[ManagedProcess], None] | None = None,
) -> int:
    """Run the child until it ends or we are told to stop (SIGINT/SIGTERM); exit status for the CLI."""
    directory = prepared.directory
    last_saved = [0.0]
    server: ManagedProcess | None = None

    def progress(p: LoadProgress) -> None:
        now = time.monotonic()
        if p.phase == "ready":
            prepared.figures.update(load_seconds=round(p.seconds, 3), ready_since=time.time())
        if p.phase == "ready" or now - last_saved[0] > 0.5:
            last_saved[0] = now
            state.save(directory, _state_record(prepared, server, "loading" if p.phase != "ready" else "ready",
                                                progress={"phase": p.phase, "loaded": p.loaded, "total": p.total, "seconds": p.seconds}))
        if on_progress:
            on_progress(p)

    def event(message: str) -> None:
        files.append_line(directory / "events.log", f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}")
        if server is not None and server.status == "restarting":
            prepared.figures.update(last_restart_reason=server.last_exit, last_restart_at=time.time())
        if server is not None and server.status in ("ready", "restarting", "failed"):
            extra = {"error": server.last_exit} if server.status == "failed" else {}
            state.save(directory, _state_record(prepared, server, server.status, last_exit=server.last_exit, **extra))
        if on_event and not (server is not None and server.status == "failed"):
            on_event(message)  # the final death is raised as the one-line error instead

    def terminate(signum: int, frame: Any) -> None:
        raise _Terminate()

    previous = signal.signal(signal.SIGTERM, terminate)
    server = prepared.make_process(on_progress=progress, on_event=event)
    state.save(directory, _state_record(prepared, server, "starting"))
    try:
        try:
            server.start()
        except ServerError as exc:
            files.append_line(directory / "events.log", f"{time.strftime('%Y-%m-%d %H:%M:%S')} {server.name} failed to start: {exc}")
            state.save(directory, _state_record(prepared, server, "failed", error=str(exc)))
            raise
        state.save(directory, _state_record(prepared, server, "ready"))
        if on_ready:
            on_ready(server)
        code = server.wait()
        reason = server.last_exit or server.explain(code)
        state.save(directory, _state_record(prepared, server, "failed", error=reason))
        raise ServerDied(reason)
    except (KeyboardInterrupt, _Terminate):
        return 0
    finally:
        # a second SIGTERM or Ctrl-C while llama-server is being stopped must not cut the stop short with a
        # traceback (systemd, `timeout`, an impatient operator): the stop is bounded (TERM, then KILL)
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            server.stop()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
        if state.read_state(directory / state.STATE).get("status") != "failed":
            with contextlib.suppress(OSError):
                (directory / state.STATE).unlink()


def start_detached(prepared: Prepared) -> subprocess.Popen[bytes]:
    """Start ``pyllm _supervise DIR`` in its own session; it outlives this process."""
    files.write_json_atomic(prepared.directory / LAUNCH, prepared.to_json(), mode=files.PRIVATE_FILE)
    with files.open_private(prepared.directory / "supervisor.log", "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pyllm_a100", "_supervise", str(prepared.directory)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            cwd="/",
        )


def wait_detached(prepared: Prepared, proc: subprocess.Popen[bytes], on_progress: Callable[[LoadProgress], None] | None = None) -> dict[str, Any]:
    """Follow the supervisor's state.json until ready (return it) or failed (raise)."""
    path = prepared.directory / state.STATE
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
            tail = (prepared.directory / "supervisor.log").read_text(errors="replace").strip().splitlines()[-1:] if (prepared.directory / "supervisor.log").exists() else []
            raise ServerDied(f"the detached supervisor exited ({code}) before it was ready: {' '.join(tail)}")
        time.sleep(0.25)


def supervise(directory: Path) -> int:
    """Entry point of the detached supervisor (``pyllm _supervise DIR``)."""
    prepared = Prepared.from_json(json.loads((directory / LAUNCH).read_text()), directory)
    try:
        return run(prepared, on_event=lambda m: print(m, flush=True))
    except ServerError as exc:
        print(f"error: {exc}", flush=True)
        return 1
