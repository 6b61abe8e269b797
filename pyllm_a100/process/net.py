"""Small network facts: loopback addresses, ports in use, a free port."""

from __future__ import annotations

import errno
import ipaddress
import re
import socket


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_error(host: str, port: int) -> OSError | None:
    """Why ``host:port`` cannot be bound now (EADDRINUSE, EADDRNOTAVAIL, ...), or None when it can."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc
    return None


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be an address to bind (not an IP and not a name that resolves), or None."""
    if not host or host != host.strip():
        return "an empty or space-padded address"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"not an IP address and not a name this machine resolves ({getattr(exc, 'strerror', None) or exc})"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_owner(port: int) -> str:
    """' by PID n (command)' for a listening port, or '' when unknown."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                proc = psutil.Process(conn.pid)
                command = re.sub(r"\s+", " ", " ".join(proc.cmdline())).strip()  # argv may hold newlines
                command = command if len(command) <= 80 else command[:77] + "..."
                return f" by PID {conn.pid} ({command})"
    except Exception:  # permissions, races: the owner is a nicety
        pass
    return ""


def bind_refusal(host: str, port: int) -> tuple[bool, str] | None:
    """(port in use?, the one-line reason) when ``host:port`` cannot be listened on now, else None.

    ``host`` must already have passed :func:`host_problem` (callers check arguments first)."""
    error = bind_error(host, port)
    if error is None:
        return None
    if error.errno == errno.EADDRINUSE:
        return True, f"port {port} on {host} is already in use{port_owner(port)}"
    if error.errno == errno.EADDRNOTAVAIL:
        return False, (f"--host {host} is not an address of this machine ({error.strerror}): use 127.0.0.1 (this machine only), "
                       "0.0.0.0 (every interface) or one of this machine's addresses (ip addr)")
    if error.errno == errno.EACCES:
        return False, f"--port {port}: ports below 1024 need root; use a port of 1024 or more (e.g. 8080)"
    return False, f"cannot listen on {host}:{port} ({error.strerror or error})"
