"""llama.cpp's RPC backend: one model's layers over several machines.

``RpcWorker`` runs this build's ``rpc-server`` (supervised like the server). rpc-server
has no authentication and has had memory-safety bugs reachable over the network, so a
worker binds loopback unless the caller explicitly allows a network address (a private
network or a tunnel). :func:`hello` (llamacpp.rpc_protocol) tells a live worker from a dead
port or some other service; :func:`list_devices` asks llama.cpp itself for the devices (local
and remote) and their memory.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess

from ..errors import RpcError
from ..llamacpp.native import binary
from ..llamacpp.rpc_protocol import DEFAULT_PORT, Endpoint, hello, parse_endpoints  # noqa: F401  (used through serve.rpc)
from .process import ManagedProcess
from .net import bind_refusal, host_problem, is_loopback

NO_AUTH_WARNING = (
    "rpc-server has no authentication: anyone who can reach the port can run code paths that have had "
    "memory-safety bugs; bind it only on a private network or behind a tunnel"
)


@dataclasses.dataclass(frozen=True)
class Device:
    name: str  # "CUDA0", "RPC0"
    description: str
    total_mib: int
    free_mib: int


def list_devices(endpoints: list[Endpoint] | None = None, env: dict[str, str] | None = None) -> list[Device]:
    """Devices llama.cpp would use, in its order (the order --tensor-split follows)."""
    args = [str(binary("llama-server"))]
    if endpoints:
        args += ["--rpc", ",".join(map(str, endpoints))]  # before --list-devices, which acts as it is parsed
    args.append("--list-devices")
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    devices = []
    for line in (out.stdout + out.stderr).splitlines():
        m = re.match(r"\s+(\w+): (.+) \((\d+) MiB, (\d+) MiB free\)", line)
        if m:
            devices.append(Device(m[1], m[2], int(m[3]), int(m[4])))
    if out.returncode != 0 or (endpoints and not any(d.name.startswith("RPC") for d in devices)):
        # llama-server dies listing them (an RPC failure at start): say so, never "no GPU is visible"
        lines = [line for line in (out.stderr + out.stdout).splitlines() if line.strip() and not line.startswith("#")]
        code = out.returncode
        why = (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}") if code else \
            "it listed no device of the workers"
        raise RpcError(f"llama-server could not list the devices with --rpc {','.join(map(str, endpoints or []))} "
                       f"({why}{': ' + lines[-1].strip() if lines else ''}): check the workers (pyllm ps, pyllm logs "
                       "NAME) and that they run this same build")
    return devices


@dataclasses.dataclass
class WorkerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    devices: str | None = None  # "CUDA0,CUDA1"
    cache: bool = False
    threads: int | None = None
    allow_network: bool = False

    def __post_init__(self) -> None:
        problem = host_problem(self.host)
        if problem:
            raise RpcError(f"--host {self.host!r} is {problem}: use 127.0.0.1, or this machine's private-network address with --allow-network")
        if self.host in ("0.0.0.0", "::") and not self.allow_network:
            raise RpcError(f"--host {self.host} would expose rpc-server on every interface: {NO_AUTH_WARNING}; "
                           "if this host is on a private network, pass --allow-network with that network's own address")
        if not is_loopback(self.host) and not self.allow_network:
            raise RpcError(f"--host {self.host} is not loopback: {NO_AUTH_WARNING}; pass --allow-network to bind it anyway")
        if not 1 <= self.port <= 65535:
            raise RpcError(f"--port {self.port}: must be between 1 and 65535")
        if self.threads is not None and self.threads < 1:
            raise RpcError(f"--threads {self.threads}: must be at least 1 (or leave it out: rpc-server picks)")
        refused = bind_refusal(self.host, self.port)
        if refused:
            in_use, reason = refused
            raise RpcError(reason + (": pass another --port" if in_use else ""))

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host, self.port)

    def to_argv(self, rpc_binary: str | os.PathLike[str]) -> list[str]:
        argv = [str(rpc_binary), "--host", self.host, "--port", str(self.port)]
        if self.devices:
            argv += ["--device", self.devices]
        if self.cache:
            argv.append("--cache")
        if self.threads:
            argv += ["--threads", str(self.threads)]
        return argv


class RpcWorker(ManagedProcess):
    """A supervised rpc-server; ready when it answers the RPC handshake."""

    name = "rpc-server"

    def __init__(self, config: WorkerConfig, *, log_path: str | os.PathLike[str] | None = None, ready_timeout: float | None = 120,
                 restart: int = 0, on_event=None, env: dict[str, str] | None = None) -> None:
        self.config = config
        super().__init__(config.to_argv(binary("rpc-server")), log_path=log_path, ready_timeout=ready_timeout,
                         restart=restart, on_event=on_event, env=env)

    def ready(self) -> bool:
        try:
            hello(self.config.endpoint, timeout=1.0)
            return True
        except RpcError:
            return False
