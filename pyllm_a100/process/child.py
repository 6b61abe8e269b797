"""A supervised child process: start, wait until ready, stop; restarts after crashes.

Shared by the managed llama-server (:class:`pyllm_a100.serve.server.Server`) and the RPC
worker (:class:`pyllm_a100.rpc.worker.RpcWorker`); subclasses say what "ready" means and how to
explain a death. The child gets SIGKILL if its owner dies (PR_SET_PDEATHSIG), so it
never outlives the pyllm process, even one killed with SIGKILL.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from . import failures
from ..errors import ServerDied, ServerStartTimeout

log = logging.getLogger(__name__)


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the parent dies (even by SIGKILL)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class ManagedProcess(abc.ABC):
    """One child process with a log file, readiness, TERM-then-KILL stop and supervision."""

    name = "process"

    def __init__(
        self,
        argv: list[str],
        *,
        log_path: str | os.PathLike[str] | None = None,
        ready_timeout: float | None = None,
        restart: int = 0,
        on_event: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = argv
        self.log_path = Path(log_path) if log_path else None
        self.ready_timeout = ready_timeout
        self.restart = restart
        self.on_event = on_event or (lambda message: log.info("%s", message))
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.status = "starting"  # starting -> ready -> (restarting -> ready)* -> failed | stopped
        self.last_exit: str | None = None
        self._log_file: IO[bytes] | None = None
        self._log_start = 0
        self._started_at = time.monotonic()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- what subclasses decide

    @abc.abstractmethod
    def ready(self) -> bool:
        """True once the child serves (polled every 0.1 s while starting)."""

    def on_waiting(self) -> None:
        """Called on each poll while not ready (progress reporting)."""

    def on_ready(self) -> None:
        """Called once ready."""

    def explain(self, code: int | None) -> str:
        """One line: why the child stopped, from its log."""
        return failures.explain(self.log_text(), code, None, log_path=self.log_path)

    # -- lifecycle

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __enter__(self) -> ManagedProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> ManagedProcess:
        """Start the child and wait until it is ready (or raise why not)."""
        self._spawn()
        self.wait_ready()
        self.status = "ready"
        if self._supervisor is None:  # also with restart=0: a death is noticed, explained and reported
            self._supervisor = threading.Thread(target=self._supervise, name=f"pyllm-supervise-{self.name}", daemon=True)
            self._supervisor.start()
        return self

    def _spawn(self) -> None:
        env = dict(self.env if self.env is not None else os.environ)
        env.setdefault("CUDA_CACHE_MAXSIZE", "4294967296")  # keep JIT-compiled PTX between runs
        if self.log_path is not None:
            from ..home import open_private

            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open_private(self.log_path, "ab")  # 0600: the log holds prompts
        else:
            self._log_file = tempfile.NamedTemporaryFile(prefix=f"{self.name}-", suffix=".log", delete=False)
            self.log_path = Path(self._log_file.name)
        self._log_file.write(f"\n=== pyllm-a100: starting {self.name}: {' '.join(self.argv)}\n".encode())
        self._log_file.flush()
        self._log_start = self._log_file.tell()
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            env=env, preexec_fn=_die_with_parent, close_fds=True,
        )
        self._log_file.write(f"=== pyllm-a100: {self.name} pid {self.proc.pid}\n".encode())
        self._started_at = time.monotonic()
        self.on_event(f"started {self.name} (pid {self.proc.pid}), log {self.log_path}")

    def log_text(self, since_start: bool = True) -> str:
        """The log; by default only what the current (or last) run wrote, never earlier runs' lines."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            if since_start:
                f.seek(self._log_start)
            return f.read().decode("utf-8", errors="replace")

    def wait_ready(self) -> None:
        assert self.proc is not None
        deadline = None if self.ready_timeout is None else time.monotonic() + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise ServerDied(self.explain(self.proc.returncode))
            if self.ready():
                self.on_ready()
                return
            self.on_waiting()
            if deadline is not None and time.monotonic() > deadline:
                tail = failures.tail(self.log_text(), 3)
                self.stop()
                raise ServerStartTimeout(f"{self.name} was not ready after {self.ready_timeout:.0f} s (last log: {tail}); see {self.log_path}")
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> None:
        """TERM, bounded wait, KILL, bounded wait. Safe to call twice."""
        self._stopping.set()
        if self.status != "failed":
            self.status = "stopped"
        with self._lock:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5)
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
        if self._supervisor is not None and self._supervisor is not threading.current_thread():
            self._supervisor.join(timeout=5)

    def wait(self) -> int:
        """Block until the child ends for good (supervision included); its exit status."""
        while True:
            if self._supervisor is not None and self._supervisor.is_alive():
                self._supervisor.join(timeout=0.5)
                continue
            assert self.proc is not None
            code = self.proc.wait()
            if self._supervisor is not None and self._supervisor.is_alive():
                continue
            return code

    def _supervise(self) -> None:
        """Notice a death after ready; restart with backoff up to ``restart`` times, then report ``failed``."""
        while not self._stopping.is_set():
            assert self.proc is not None
            code = self.proc.poll()
            if code is None:
                self._stopping.wait(0.2)
                continue
            if self._stopping.is_set():
                return
            reason = self.explain(code)
            self.last_exit = reason
            if self.restarts >= self.restart:
                self.status = "failed"
                used = f"{self.restart} restart(s) used" if self.restart else "restarts are off (--restart 0)"
                self.on_event(f"{self.name} died ({reason}); not restarting: {used}")
                return
            delay = min(30.0, 1.0 * 2**self.restarts)
            self.restarts += 1
            self.status = "restarting"
            self.on_event(f"{self.name} died ({reason}); restart {self.restarts}/{self.restart} in {delay:.0f} s")
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                if self._log_file is not None:
                    self._log_file.close()
                self._spawn()
            try:
                self.wait_ready()
                self.status = "ready"
                self.on_event(f"{self.name} ready again (pid {self.proc.pid})")
            except ServerDied as exc:
                self.on_event(f"restart failed: {exc}")
