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
from .rpc import DEFAULT_PORT as DEFAULT_RPC_PORT
from .options import ServeOptions
from .rpc import RpcWorker, WorkerConfig
from .server import LoadProgress, Server, ServerConfig, absolute_paths, check_api_key, make_config

REQUEST = "request.json"


@dataclasses.dataclass
class ServeRequest(ServeOptions):
    """What `pyllm serve` was asked (ServeOptions) and what prepare() settled; JSON-serialisable so a detached
    supervisor can run it. The API key itself is never here: prepare() writes it to a 0600 file."""

    api_key_file: str | None = None
    kind: str = "server"

    def to_config(self, *, require_api_key: bool = True) -> ServerConfig:
        """Validated ServerConfig (raises the one-line errors for bad input)."""
        return make_config(**self.config_kwargs(), api_key_file=self.api_key_file, require_api_key=require_api_key)


@dataclasses.dataclass
class WorkerRequest:
    """What `pyllm rpc-worker` was asked (JSON-serialisable, like ServeRequest)."""

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
    request: ServeRequest | WorkerRequest
    config: ServerConfig | WorkerConfig
    directory: Path
    generated_key: str | None = None  # shown once to the user, never again
    # kept in every state.json write (pyllm metrics): load_seconds, ready_since, last_restart_reason, ...
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    _gpus_used: list[int] | None = None

    def make_process(self, **callbacks: Any) -> ManagedProcess:
        log_path = self.directory / "server.log"
        if isinstance(self.config, WorkerConfig):
            callbacks.pop("on_progress", None)
            return RpcWorker(self.config, log_path=log_path, restart=self.request.restart, **callbacks)
        return Server(config=self.config, log_path=log_path, restart=self.request.restarts, **callbacks)

    def describe(self) -> dict[str, Any]:
        if isinstance(self.config, WorkerConfig):
            return {"kind": "rpc-worker", "host": self.config.host, "port": self.config.port,
                    "url": f"rpc://{self.config.endpoint}", "model": f"devices: {self.config.devices or 'all'}"}
        return {"kind": "server", "host": self.config.host, "port": self.config.port, "url": self.config.public_url,
                "model": str(self.config.model.first), "served_name": self.config.served_name,
                "api_key_file": self.request.api_key_file,
                "draft": self.config.draft.describe() if self.config.draft is not None else None,
                "gpus": self.gpus_used(), "gpus_given": self.config.gpus is not None,
                "metrics": f"{self.config.public_url}/metrics" if self.config.metrics else None,
                "service": os.environ.get("PYLLM_SERVICE"),  # the systemd unit running it (pyllm service install)
                "options": self.request.public(),
                "plan": self.config.capacity.as_dict() if self.config.capacity is not None else None}

    def gpus_used(self) -> list[int]:
        """nvidia-smi numbers of the GPUs this server may use: --gpus, else every visible one when it offloads."""
        if self._gpus_used is None:
            cfg = self.config
            if getattr(cfg, "gpus", None) is not None:
                self._gpus_used = list(cfg.gpus)
            elif isinstance(cfg, ServerConfig) and cfg.n_gpu_layers and _cuda_build():
                from ..devices.gpus import visible_gpus

                self._gpus_used = [g.physical_index for g in visible_gpus()]
            else:
                self._gpus_used = []
        return self._gpus_used


def _cuda_build() -> bool:
    from ..llamacpp.native import build_info

    return bool(build_info().get("cuda"))


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
    request.name = directory.name
    return Prepared(request, config, directory)


def prepare(request: ServeRequest, api_key: str | None = None) -> Prepared:
    """Validate everything and create the state folder (with the API key file if any).

    Every path is made absolute here (the model, files named after ``--``, a key file): a
    detached supervisor runs with cwd ``/`` and must find the same files.
    """
    # Validate before touching disk: a bad model or port must leave nothing behind.
    _check_restart(request.restarts)
    if request.name is not None:
        state.check_name(request.name)
    api_key, request.api_key = api_key if api_key is not None else request.api_key, None  # never into request.json
    if api_key is not None:
        check_api_key(api_key)
    if request.api_key_file is not None:
        request.api_key_file = os.path.abspath(os.path.expanduser(request.api_key_file))
    request.extra_args = absolute_paths(request.extra_args)
    probe = request.to_config(require_api_key=False)  # a key file is written below when one is needed
    request.model = str(probe.model.first)  # resolved: a relative path, a folder, a glob or REPO:QUANT
    if probe.draft is not None and probe.draft.files is not None:
        request.draft = str(probe.draft.files.first)  # resolved too: a relative path, or what auto found
    # an explicit --name takes over a failed entry of that name (a systemd restart keeps its name)
    directory = state.new_server_dir(request.name or f"{probe.model.name}-{probe.port}", reuse_failed=request.name is not None,
                                     exact=request.name is not None)
    generated = None
    if api_key is None and request.api_key_file is None and not is_loopback(request.host):
        api_key = generated = secrets.token_urlsafe(32)
    if api_key is not None:
        request.api_key_file = str(files.write_secret(directory / "api_key", api_key))
    request.port = probe.port
    request.name = directory.name
    config = dataclasses.replace(probe, api_key_file=Path(request.api_key_file) if request.api_key_file else None)
    return Prepared(request, config, directory, generated)


def _state_record(prepared: Prepared, server: ManagedProcess | None, status: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": prepared.directory.name,
        "status": status,
        **state.owner_record(),  # pid, start time, command line digest: `stop` signals only this process
        # None once it has exited: while restarting, ps showed the PID of the llama-server that died
        "server_pid": server.pid if server and server.proc and server.proc.returncode is None else None,
        **prepared.describe(),
        "restart_limit": getattr(prepared.request, "restarts", prepared.request.restart),
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
    files.write_json_atomic(prepared.directory / REQUEST, dataclasses.asdict(prepared.request), mode=files.PRIVATE_FILE)
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
    data = json.loads((directory / REQUEST).read_text())
    request = WorkerRequest(**data) if data.get("kind") == "rpc-worker" else ServeRequest(**data)
    prepared = Prepared(request, request.to_config(), directory)
    try:
        return run(prepared, on_event=lambda m: print(m, flush=True))
    except ServerError as exc:
        print(f"error: {exc}", flush=True)
        return 1
