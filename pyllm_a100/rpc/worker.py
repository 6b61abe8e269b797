"""`pyllm rpc-worker`: this build's rpc-server, defined once (:class:`WorkerOptions`) and supervised (:class:`RpcWorker`).

rpc-server has no authentication and has had memory-safety bugs reachable over the network, so a worker binds
loopback unless the caller explicitly allows a network address (a private network or a tunnel). It is ready when
it answers the RPC handshake (protocol.hello).
"""

from __future__ import annotations

import dataclasses
import os

from ..command_options import RESTART_HELP, CommandOptions, option
from ..errors import RpcError
from ..llamacpp.native import binary
from ..process.child import ManagedProcess
from ..process.net import bind_refusal, host_problem, is_loopback
from .protocol import DEFAULT_PORT, Endpoint, hello

NO_AUTH_WARNING = (
    "rpc-server has no authentication: anyone who can reach the port can run code paths that have had "
    "memory-safety bugs; bind it only on a private network or behind a tunnel"
)


@dataclasses.dataclass(frozen=True)
class WorkerOptions(CommandOptions):
    """What `pyllm rpc-worker` is asked; the command is generated from these fields (cli/generated.py)."""

    ENV_PREFIX = "PYLLM_WORKER_"

    host: str = option("127.0.0.1", "Address to bind (loopback unless --allow-network).")
    port: int = option(DEFAULT_PORT, "Port to listen on.")
    device: str | None = option(None, "Devices to offer, e.g. CUDA0,CUDA1 (default: all).")
    cache: bool = option(False, "Cache received tensors on local disk (faster reloads).")
    threads: int | None = option(None, "CPU threads for a CPU device.")
    allow_network: bool = option(
        False, "Bind a non-loopback address. rpc-server has NO authentication and has had memory-safety bugs "
               "reachable over the network: use only on a private network or behind a tunnel.")
    name: str | None = option(None, "Name in pyllm ps/stop/logs: letters, digits, . _ - (default: rpc-worker-PORT).")
    detach: bool = option(False, "Return once it answers; a supervisor keeps it running.")
    restart: int | None = option(None, RESTART_HELP)

    @property
    def endpoint(self) -> Endpoint:
        """Where clients reach it (loopback for a wildcard bind)."""
        return Endpoint("127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host, self.port)

    def to_argv(self, rpc_binary: str | os.PathLike[str]) -> list[str]:
        argv = [str(rpc_binary), "--host", self.host, "--port", str(self.port)]
        if self.device:
            argv += ["--device", self.device]
        if self.cache:
            argv.append("--cache")
        if self.threads:
            argv += ["--threads", str(self.threads)]
        return argv


def check(options: WorkerOptions) -> WorkerOptions:
    """Refuse, in one line each, what must not start: an open bind without --allow-network, a bad port or thread
    count, a busy port."""
    o = options
    problem = host_problem(o.host)
    if problem:
        raise RpcError(f"--host {o.host!r} is {problem}: use 127.0.0.1, or this machine's private-network address with --allow-network")
    if o.host in ("0.0.0.0", "::") and not o.allow_network:
        raise RpcError(f"--host {o.host} would expose rpc-server on every interface: {NO_AUTH_WARNING}; "
                       "if this host is on a private network, pass --allow-network with that network's own address")
    if not is_loopback(o.host) and not o.allow_network:
        raise RpcError(f"--host {o.host} is not loopback: {NO_AUTH_WARNING}; pass --allow-network to bind it anyway")
    if not 1 <= o.port <= 65535:
        raise RpcError(f"--port {o.port}: must be between 1 and 65535")
    if o.threads is not None and o.threads < 1:
        raise RpcError(f"--threads {o.threads}: must be at least 1 (or leave it out: rpc-server picks)")
    refused = bind_refusal(o.host, o.port)
    if refused:
        in_use, reason = refused
        raise RpcError(reason + (": pass another --port" if in_use else ""))
    return options


class RpcWorker(ManagedProcess):
    """A supervised rpc-server; ready when it answers the RPC handshake."""

    name = "rpc-server"

    def __init__(self, options: WorkerOptions, *, log_path: str | os.PathLike[str] | None = None,
                 ready_timeout: float | None = 120, restart: int = 0, on_event=None,
                 env: dict[str, str] | None = None) -> None:
        self.config = check(options)
        super().__init__(options.to_argv(binary("rpc-server")), log_path=log_path, ready_timeout=ready_timeout,
                         restart=restart, on_event=on_event, env=env)

    def ready(self) -> bool:
        try:
            hello(self.config.endpoint, timeout=1.0)
            return True
        except RpcError:
            return False
