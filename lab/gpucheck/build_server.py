"""The llama-server of one llama.cpp build folder (python -m lab.runs.gpu_decode's pin-bin, patched-bin, ...), run with raw
arguments for the side-by-side GPU scripts (gpu-token-check, gpu-concurrency, gpu-tensor-check).

The package's :class:`~pyllm_a100.serve.process.ManagedProcess` does the work: log file, readiness (/health 200),
TERM-then-KILL stop, and the child dies with its owner, so a script killed mid-run leaves no server on the GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from pyllm_a100.serve.net import free_port
from pyllm_a100.serve.process import ManagedProcess


class BuildServer(ManagedProcess):
    """``BuildServer(bin_dir, ["-m", model, "-ngl", "99"], log_path=...)``: port chosen here, LD_LIBRARY_PATH = bin_dir."""

    name = "llama-server"

    def __init__(self, bin_dir: str | os.PathLike[str], args: list[str], *, log_path: str | os.PathLike[str],
                 extra_env: dict[str, str] | None = None, ready_timeout: float = 600) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir), **(extra_env or {}))
        super().__init__([str(Path(bin_dir) / "llama-server"), *args, "--port", str(self.port)],
                         log_path=log_path, ready_timeout=ready_timeout, env=env)

    def ready(self) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False
