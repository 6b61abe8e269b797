"""Shared fixtures: the installed package, its build, and the `pyllm` command."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYLLM = Path(sys.executable).parent / "pyllm"


def pytest_configure(config: pytest.Config) -> None:
    import pyllm_a100

    where = Path(pyllm_a100.__file__).resolve().parent
    if where == REPO / "pyllm_a100":
        raise pytest.UsageError(
            "the tests imported pyllm_a100 from the source checkout, which has no compiled llama.cpp: "
            "run `pytest` (not `python -m pytest`) in the venv where the package is installed"
        )


def run_pyllm(*args: str, env: dict | None = None, timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess:
    """Run the installed `pyllm` command; returns the completed process (text mode)."""
    full_env = dict(os.environ, **(env or {}))
    result = subprocess.run([str(PYLLM), *args], capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"pyllm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def run_python(code: str, *, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run Python code in a fresh interpreter of the test venv, outside the checkout
    (so the installed package, not the source folder, is imported)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
        env=env if env is not None else dict(os.environ), cwd=tempfile.gettempdir(),
    )


@pytest.fixture(scope="session")
def native_dir() -> Path:
    from pyllm_a100.native import native_dir

    return native_dir()


@pytest.fixture(scope="session")
def info() -> dict:
    from pyllm_a100 import build_info

    return build_info()


@pytest.fixture(autouse=True)
def pyllm_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own PYLLM_HOME: servers, logs and keys never leak between tests."""
    home = tmp_path_factory.mktemp("pyllm-home")
    monkeypatch.setenv("PYLLM_HOME", str(home))
    return home


TINY_PRESETS = ("tiny-llama", "tiny-deepseek4", "tiny-glm-dsa", "tiny-deepseek32")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One synthetic model per tiny preset, written once per session (seed 42)."""
    from pyllm_a100.synth import synthesize

    root = tmp_path_factory.mktemp("models")
    return {name: synthesize(name, root / f"{name}.gguf", seed=42).first for name in TINY_PRESETS}


@pytest.fixture(scope="session")
def tiny_deepseek4(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["tiny-deepseek4"]


@pytest.fixture
def servers():
    """Start managed servers with servers.start(model, **options); all are stopped after the test."""
    from pyllm_a100 import Server

    started: list[Server] = []

    class Starter:
        def start(self, model, **options) -> Server:
            options.setdefault("port", 0)
            options.setdefault("ready_timeout", 300)
            server = Server(model, **options)
            started.append(server)
            return server.start()

    yield Starter()
    for server in started:
        server.stop()
