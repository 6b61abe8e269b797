"""Patch 0034 (vendor/patches): llama-server gives a new request the idle slot beside the busy ones, so the busy
slots stay one run of consecutive sequence ids and a decode step of N streams is one forward (a ubatch holds only
consecutive sequence ids with per-sequence KV streams). LLAMA_SERVER_SLOT_LRU=1 is the pin's rule, least recently
used alone: the same probe then lands in the gap's far side, which shows the test can fail."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import pytest

PROMPT_TAIL = list(range(30, 46))  # each prompt starts with its own token: no slot's cache matches another's prompt


def _complete(url: str, first: int, **extra) -> dict:
    body = {"prompt": [first, *PROMPT_TAIL], "n_predict": 1, "cache_prompt": True, **extra}
    reply = httpx.post(url + "/completion", json=body, timeout=120)
    reply.raise_for_status()
    return reply.json()


def _keep_busy(url: str, slot: int, first: int, started: threading.Event, stop: threading.Event) -> None:
    body = {"prompt": [first, *PROMPT_TAIL], "n_predict": 4000, "ignore_eos": True, "stream": True, "id_slot": slot}
    with httpx.stream("POST", url + "/completion", json=body, timeout=120) as reply:
        for _ in reply.iter_lines():
            started.set()
            if stop.is_set():
                return  # closing the stream ends the task


@pytest.mark.parametrize(("lru_only", "expected"), [("", 2), ("1", 0)], ids=["0034", "pin-rule"])
def test_a_new_request_fills_the_gap_between_busy_slots(servers, tiny_models: dict[str, Path], lru_only: str,
                                                        expected: int) -> None:
    env = dict(os.environ, LLAMA_SERVER_SLOT_LRU=lru_only) if lru_only else None
    server = servers.start(tiny_models["tiny-llama"], parallel=4, ctx_size=4 * 4096, env=env)
    url = server.base_url
    for k, slot in enumerate((0, 1, 2, 3)):  # last used in this order: slot 0 is the least recently used
        assert _complete(url, 100 + k, id_slot=slot)["id_slot"] == slot
    stop, threads = threading.Event(), []
    try:
        for slot, first in ((1, 110), (3, 111)):
            started = threading.Event()
            thread = threading.Thread(target=_keep_busy, args=(url, slot, first, started, stop), daemon=True)
            thread.start()
            threads.append(thread)
            assert started.wait(60), f"slot {slot} never started streaming"
        got = _complete(url, 120)["id_slot"]
        busy = sorted(s["id"] for s in httpx.get(url + "/slots", timeout=30).json() if s["is_processing"])
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert busy == [1, 3], f"the probe ran while slots {busy} were busy, not 1 and 3"
    # 0034: slot 2 has two busy neighbours (busy slots become 1-3, one run); LRU alone takes slot 0 (runs 0-1 and 3)
    assert got == expected, f"the request went to slot {got}, expected {expected}"
