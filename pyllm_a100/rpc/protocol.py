"""llama.cpp's RPC protocol, as a client speaks it: worker endpoints and the handshake.

:func:`hello` tells a live rpc-server from a dead port or some other service, and refuses a worker of another
protocol version (the ops a graph may hold differ); :func:`probe` asks, on the same connection, for the worker's
devices and their memory. Used by `pyllm serve --rpc`, `pyllm doctor --rpc` and ``Llama(rpc=...)``.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import struct

from ..errors import NativeBuildNotFound, RpcError
from ..llamacpp.native import build_info

DEFAULT_PORT = 50052
RPC_CMD_GET_DEVICE_MEMORY, RPC_CMD_HELLO, RPC_CMD_DEVICE_COUNT = 11, 14, 15  # ggml-rpc.cpp: enum rpc_cmd
CONN_CAPS_SIZE = 24  # ggml-rpc transport.h: RPC_CONN_CAPS_SIZE
PROTO_MAJOR = 7  # ggml-rpc.h: RPC_PROTO_MAJOR_VERSION of the pinned tree


@dataclasses.dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(text: str) -> list[Endpoint]:
    """``"10.0.0.2:50052,10.0.0.3:50052"`` -> endpoints (one-line errors for typos)."""
    if not text.strip():
        raise RpcError(f"--rpc {text!r} is empty: give HOST:PORT[,HOST:PORT...] of rpc-server workers (pyllm rpc-worker), or leave it out")
    out = []
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d+)", part)
        if not m or not 1 <= int(m[2]) <= 65535:
            raise RpcError(f"--rpc {text}: {part!r} is not HOST:PORT (e.g. 10.0.0.2:{DEFAULT_PORT})")
        out.append(Endpoint(m[1], int(m[2])))
    return out


@dataclasses.dataclass(frozen=True)
class Worker:
    """What a worker said on one connection: its protocol version and each of its devices' (free, total) bytes."""

    endpoint: Endpoint
    version: tuple[int, int, int]
    memory: tuple[tuple[int, int], ...] = ()


def hello(endpoint: Endpoint, timeout: float = 5.0) -> tuple[int, int, int]:
    """The RPC handshake: (major, minor, patch) of the worker, or RpcError saying what answered."""
    return probe(endpoint, timeout=timeout, devices=False).version


def probe(endpoint: Endpoint, timeout: float = 5.0, *, devices: bool = True) -> Worker:
    """One connection to a worker: the handshake (a dead port, another service or another build is one RpcError
    line), then, with ``devices``, its device count and each device's memory, as llama.cpp's own client asks them."""
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except ConnectionRefusedError:
        raise RpcError(f"no rpc-server answers at {endpoint} (connection refused): start one there with `pyllm rpc-worker --port {endpoint.port}`") from None
    except OSError as exc:
        raise RpcError(f"cannot reach the rpc-server at {endpoint} ({exc.strerror or exc}): check the address, the network and any firewall") from None
    with sock:
        sock.settimeout(timeout)
        body = _ask(sock, endpoint, RPC_CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE, "the RPC handshake")
        version = (body[0], body[1], body[2])
        ours = _build_protocol()
        if version[0] != PROTO_MAJOR or (ours is not None and "%d.%d.%d" % version != ours):
            raise RpcError(f"the rpc-server at {endpoint} speaks RPC {'%d.%d.%d' % version}, this build "
                           f"{ours or f'{PROTO_MAJOR}.x'} (the ops a graph may hold differ): run the same pyllm-a100 "
                           "build on every machine")
        if not devices:
            return Worker(endpoint, version)
        (count,) = struct.unpack("<I", _ask(sock, endpoint, RPC_CMD_DEVICE_COUNT, b"", 4, "a device count"))
        memory = tuple(struct.unpack("<QQ", _ask(sock, endpoint, RPC_CMD_GET_DEVICE_MEMORY, struct.pack("<I", i), 16,
                                                 "a device's memory")) for i in range(count))
    return Worker(endpoint, version, memory)


def _ask(sock: socket.socket, endpoint: Endpoint, cmd: int, request: bytes, size: int, what: str) -> bytes:
    """One command and its reply (ggml-rpc: | cmd 1 byte | size 8 bytes | request |, then | size 8 bytes | reply |)."""
    try:
        sock.sendall(bytes([cmd]) + struct.pack("<Q", len(request)) + request)
        (got,) = struct.unpack("<Q", _recv(sock, 8))
        if got != size:
            raise ValueError(got)
        return _recv(sock, size)
    except (OSError, ValueError, struct.error):
        raise RpcError(f"{endpoint} accepted the connection but did not answer {what}: it is not an rpc-server "
                       "(or one of a very different llama.cpp); check the port") from None


def _build_protocol() -> str | None:
    """The RPC protocol this build's rpc-server speaks (build_info.json's rpc_protocol; None: an older build_info)."""
    try:
        return build_info().get("rpc_protocol")
    except NativeBuildNotFound:  # no build here: only the major version can be checked
        return None


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ValueError("closed")
        data += chunk
    return data
