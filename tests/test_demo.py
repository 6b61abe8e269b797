"""The README's demo command end to end (minus the install): synth, serve, one openai request, stop."""

from __future__ import annotations

import re

import psutil

from conftest import run_pyllm


def test_demo_answers_once_and_stops_its_server(pyllm_home) -> None:
    result = run_pyllm("demo", timeout=600)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    pid = int(re.search(r"llama-server pid (\d+)", out)[1])
    assert re.search(r"answer: '.+'", out)
    assert re.search(r"\d+ tokens in [\d.]+ s = [\d.]+ tokens/s", out)
    assert out.rstrip().endswith("server stopped.")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert (pyllm_home / "models" / "tiny-deepseek4-demo.gguf").is_file()
