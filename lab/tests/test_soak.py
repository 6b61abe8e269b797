"""The serving soak on the CPU build: every prompt length 1..64 and 8 concurrent requests against
tiny DeepSeek-V4 in the UD-Q8_K_XL-like mix (MXFP4 experts: the mix that crashed the GPU build
on an 8-token batch), and proof that the soak sees a crash when there is one."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from lab.bench.soak import prompt_ids, soak


@pytest.fixture(scope="module")
def tiny_deepseek4_ud(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllm_a100.synth import synthesize

    return synthesize("tiny-deepseek4", tmp_path_factory.mktemp("soak") / "td-ud.gguf", weight_type="ud-q8-k-xl", seed=7).first


def test_every_length_and_eight_concurrent_requests_pass(tiny_deepseek4_ud: Path, tmp_path: Path) -> None:
    result = soak(tiny_deepseek4_ud, lengths=range(1, 65), concurrency=(8,), log_path=tmp_path / "server.log")
    assert result["crashes"] == 0, result["crash_details"]
    assert result["http_errors"] == 0, result["failures"]
    assert result["phases"]["lengths"]["requests"] == 64
    assert result["phases"]["concurrency 8"] == {**result["phases"]["concurrency 8"], "requests": 8, "errors": 0, "streamed": 4}
    assert result["requests"] == 72


def test_a_server_killed_mid_soak_is_counted_as_a_crash_and_restarted(tiny_deepseek4_ud: Path, tmp_path: Path) -> None:
    killed: list[int] = []

    def kill_once_serving(pid: int) -> None:
        process = psutil.Process(pid)
        while True:  # until it answers /health with 200 (the soak has then started sending)
            ports = [c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
            if ports and httpx.get(f"http://127.0.0.1:{ports[0]}/health", timeout=5).status_code == 200:
                break
            time.sleep(0.05)
        time.sleep(0.3)  # a few of the length requests get answered
        os.kill(pid, signal.SIGKILL)

    def on_event(message: str) -> None:  # kill the first llama-server once it serves
        match = re.search(r"started llama-server \(pid (\d+)\)", message)
        if match and not killed:
            killed.append(int(match[1]))
            threading.Thread(target=kill_once_serving, args=(killed[0],), daemon=True).start()

    result = soak(tiny_deepseek4_ud, lengths=range(1, 65), concurrency=(2,), on_event=on_event,
                  log_path=tmp_path / "server.log")
    assert killed, "the soak never reported starting llama-server"
    assert result["crashes"] == 1, result
    crash = result["crash_details"][0]
    assert "SIGKILL" in crash["reason"] and crash["exit"] == -signal.SIGKILL
    assert result["http_errors"] >= 1  # the request in flight (or the next one) failed...
    assert result["phases"]["concurrency 2"]["errors"] == 0  # ...and the restarted server served the rest


def test_prompts_have_the_exact_length_and_avoid_special_tokens() -> None:
    for length in (1, 12, 64):
        ids = prompt_ids(length, salt=length, n_vocab=1024)
        assert len(ids) == length and min(ids) >= 256 and max(ids) < 1024
    assert prompt_ids(8, 1, 1024) != prompt_ids(8, 2, 1024)
