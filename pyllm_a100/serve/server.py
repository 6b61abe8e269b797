"""The managed llama-server: start, load progress, readiness, stop, supervision (its argv: argv.py).

``Server`` is a context manager::

    with Server("model.gguf", tensor_split="1x8") as srv:
        print(srv.base_url)          # ready: /health answered 200

This llama-server opens its port only after the model is loaded, so while loading,
liveness and progress come from the process itself (alive, bytes of the model mapped
or read); readiness is ``/health`` = 200. A child that dies is reported with its exit
status and the log lines that explain it (:mod:`pyllm_a100.process.failures`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from ..errors import ServerConfigError
from ..llamacpp.native import binary
from ..models.gguf_files import ModelFiles
from ..process import failures
from ..process.child import ManagedProcess
from .config import ServerConfig
from .options import ServeOptions
from .resolve import resolve
from .validate import check_api_key, check_server_binary

log = logging.getLogger(__name__)


# --- the process -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadProgress:
    phase: str  # "loading" (model bytes coming in), "preparing" (all mapped, not ready yet), "ready"
    loaded: int  # bytes of the model read or mapped so far
    total: int
    seconds: float

    @property
    def fraction(self) -> float:
        return min(1.0, self.loaded / self.total) if self.total else 0.0


def _process_bytes(pid: int) -> int:
    """Bytes of files this process has mapped (RssFile) or read (rchar, read_bytes), whichever is most.

    With mmap (llama.cpp's default) the model's pages become resident as they are
    touched, whether they came from disk or the page cache; with --no-mmap they are read().
    """
    best = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            match = re.search(r"RssFile:\s+(\d+) kB", f.read())
            if match:
                best = int(match[1]) * 1024
    except OSError:
        return 0
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("rchar", "read_bytes"):
                    best = max(best, int(value))
    except OSError:
        pass
    return best


class Server(ManagedProcess):
    """A managed llama-server: start, wait until /health is 200, stop; optional supervision."""

    name = "llama-server"

    def __init__(
        self,
        model: str | os.PathLike[str] | ModelFiles | None = None,
        *,
        config: ServerConfig | None = None,
        key_file: Path | None = None,
        api_key: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ready_timeout: float | None = None,
        restart: int = 0,
        on_progress: Callable[[LoadProgress], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
        server_binary: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        """A model and ``pyllm serve``'s options by name (ServeOptions), or a resolved ``config`` with ``key_file``, the
        API key file its launch wrote. ``server_binary``: another llama-server to run with the same configuration (a
        benchmark's baseline)."""
        if config is None:
            if model is None:
                raise ServerConfigError("Server needs a model (a .gguf file, shard 1 of a set, or a folder)")
            if api_key is not None and "api_key_file" not in options:
                options["api_key_file"] = str(self._write_key_file(check_api_key(api_key), log_path))
            config = resolve(ServeOptions(model=model, **options))
        elif options:
            raise TypeError(f"Server(config=...) takes no serve options (they were resolved into the config): {sorted(options)}")
        self.config = config
        self.api_key = api_key
        if config.gpus is not None:
            env = config.child_env(env)  # --gpus: CUDA_VISIBLE_DEVICES for the child only
        self.on_progress = on_progress
        self._loaded = 0
        executable = check_server_binary(server_binary) if server_binary is not None else binary("llama-server")
        super().__init__(config.to_argv(executable, key_file), log_path=log_path, ready_timeout=ready_timeout,
                         restart=restart, on_event=on_event, env=env)

    @staticmethod
    def _write_key_file(api_key: str, log_path: str | os.PathLike[str] | None) -> Path:
        """The key as a file llama-server reads (--api-key-file): never on its command line."""
        import tempfile

        from ..home import write_secret

        directory = Path(log_path).parent if log_path else Path(tempfile.mkdtemp(prefix="pyllm-key-"))
        return write_secret(directory / "api_key", api_key)

    # -- addresses

    @property
    def host_for_clients(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"[{host}]" if ":" in host else host

    @property
    def base_url(self) -> str:
        return f"http://{self.host_for_clients}:{self.config.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    # -- readiness and progress

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self) -> bool:
        return self.healthy(timeout=1.0)

    def _spawn(self) -> None:
        self._loaded = 0
        super()._spawn()

    def on_waiting(self) -> None:
        assert self.proc is not None
        total = self.config.model.total_bytes
        self._loaded = max(self._loaded, _process_bytes(self.proc.pid))
        if self.on_progress:
            phase = "loading" if self._loaded < total * 0.98 else "preparing"
            self.on_progress(LoadProgress(phase, min(self._loaded, total), total, time.monotonic() - self._started_at))

    def on_ready(self) -> None:
        if self.on_progress:
            total = self.config.model.total_bytes
            self.on_progress(LoadProgress("ready", total, total, time.monotonic() - self._started_at))

    def explain(self, code: int | None) -> str:
        return failures.explain(self.log_text(), code, self.config, log_path=self.log_path)
