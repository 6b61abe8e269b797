"""Sized to the box, nothing lost under pressure (issue 40): serve plans the KV pool from memory, and a full pool
makes requests wait, in order, instead of failing every request in flight with "Context size has been exceeded".

Real llama-server (CPU build), real SmolLM2 and synthetic DeepSeek-V4 / GLM-DSA models, the openai client.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import run_pyllm

WORDS = ("river mountain signal harbor lantern copper meadow engine garden silver pocket thunder window marble "
         "orchard canvas pepper tunnel velvet rocket blanket candle forest ladder mirror violin basket desert "
         "compass feather glacier hammer island jacket kettle lemon magnet needle ocean pencil quartz ribbon").split()


def prose(n_words: int, seed: int) -> str:
    """Varied text (no two prompts share a prefix the prompt cache could reuse)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def chat(base_url: str, text: str, max_tokens: int, api_key: str | None = None, **extra) -> dict:
    """One greedy chat request through the openai client: the reply's text and finish reason."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url + "/v1", api_key=api_key or "none", max_retries=0, timeout=900)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": text + "\nSummarize."}],
                                           max_tokens=max_tokens, temperature=0, **extra)
    return {"text": reply.choices[0].message.content, "finish": reply.choices[0].finish_reason,
            "prompt_tokens": reply.usage.prompt_tokens}


def test_default_plan_gives_every_slot_the_trained_context(smollm2: Path) -> None:
    """Without --ctx-size serve prints its plan before loading: 16 slots, each up to SmolLM2's 8,192 tokens,
    within the stated RAM budget; ps --json carries the plan, doctor shows the same one."""
    with _serve_cli(smollm2) as (name, stderr):
        assert "plan: 16 slots, up to 8,192 tokens each (the trained context); pool 131,072 tokens shared" in stderr, stderr
        (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
        plan = entry["plan"]
        assert plan["slots"] == 16 and plan["per_slot"] == 8192 and plan["pool"] == 131072 and plan["fits"]
        assert "CPU: KV cache at most 25%" in plan["budget"]["rule"]
    doctor = run_pyllm("doctor", str(smollm2), "--json", check=True)
    assert json.loads(doctor.stdout)["model"]["plan"]["pool"] == 131072


def test_six_long_requests_and_a_full_context_one_all_complete_on_the_defaults(smollm2: Path, servers) -> None:
    """The measured failure: six concurrent ~2,000-token chats with max_tokens 300 got HTTP 500 "Context size has
    been exceeded" on the old default (one 8,192-token pool). Now all six complete, and so does a ~7,900-token one."""
    srv = servers.start(smollm2)
    with ThreadPoolExecutor(max_workers=7) as pool:
        six = [pool.submit(chat, srv.base_url, prose(1950, seed), 300) for seed in range(6)]
        long = pool.submit(chat, srv.base_url, prose(7700, 99), 16)
        results = [f.result() for f in six]
        whole = long.result()
    assert all(r["prompt_tokens"] > 1800 and r["text"] for r in results), [r["prompt_tokens"] for r in results]
    assert 7600 < whole["prompt_tokens"] <= 8192 - 16 and whole["finish"] in ("stop", "length"), whole


@pytest.mark.parametrize("preset", ["smollm2", "tiny-glm-dsa"])
def test_an_overflowing_pool_makes_requests_wait_and_none_fails(preset: str, smollm2: Path, tiny_models: dict[str, Path],
                                                                 servers) -> None:
    """A 4,096-token pool shared by 8 slots and 8 concurrent requests of ~1,100 tokens each (prompt + max_tokens):
    three fit at a time, the rest wait and start as room frees. The pin fails every one of them (patch 0035)."""
    model = smollm2 if preset == "smollm2" else tiny_models[preset]
    srv = servers.start(model, ctx_size=4096, parallel=8)
    words, gen = (950, 150) if preset == "smollm2" else (450, 150)
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(lambda i: chat(srv.base_url, prose(words, 100 + i), gen), range(8)))
    assert all(r["finish"] in ("stop", "length") for r in together)
    assert sum(r["prompt_tokens"] + gen for r in together) > 2 * 4096, "the requests together must outgrow the pool"


def test_waiting_changes_no_token(smollm2: Path, servers) -> None:
    """A pool that holds one request at a time: four sent together run one after the other, and each answer is the
    same request's answer on an idle server, token for token. (Requests that overlap share batches, and llama.cpp's
    arithmetic depends on the batch, as with any arrival order: that is not what this checks.)"""
    srv = servers.start(smollm2, ctx_size=2048, parallel=4)
    texts = [prose(450, 200 + i) for i in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda t: chat(srv.base_url, t, 600), texts))
    alone = [chat(srv.base_url, t, 600) for t in texts]
    assert all(r["prompt_tokens"] + 600 > 1024 for r in together), "two must not fit the pool at once"
    assert [r["text"] for r in together] == [r["text"] for r in alone]


def test_deepseek4_slots_each_hold_their_own_context_and_extra_clients_wait(tiny_deepseek4: Path, servers) -> None:
    """DeepSeek-V4's caches are per sequence: 4 slots of 1,024 tokens, 12 clients of ~700 tokens each: the extra
    clients wait for a slot, none fails."""
    srv = servers.start(tiny_deepseek4, ctx_size=4096, parallel=4)
    assert srv.config.capacity is not None and not srv.config.capacity.shared and srv.config.capacity.per_slot == 1024
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda i: chat(srv.base_url, prose(130, i), 64), range(12)))
    assert all(r["finish"] in ("stop", "length") for r in results)


def test_a_request_that_can_never_fit_is_a_400_naming_both_numbers(smollm2: Path, servers) -> None:
    srv = servers.start(smollm2, ctx_size=16384, parallel=2)
    from openai import BadRequestError

    with pytest.raises(BadRequestError) as caught:
        chat(srv.base_url, prose(3000, 7), 6000)
    message = str(caught.value)
    assert "6,000 completion" in message and "at most 8,192 tokens" in message, message


def _hold(base_url: str, text: str, max_tokens: int) -> threading.Thread:
    thread = threading.Thread(target=lambda: chat(base_url, text, max_tokens), daemon=True)
    thread.start()
    return thread


def _waiting(base_url: str, api_key: str | None = None) -> int:
    """Requests waiting for room, from llama-server's /metrics."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    text = httpx.get(base_url + "/metrics", headers=headers, timeout=10).text
    return int(float(next(line.split()[-1] for line in text.splitlines() if line.startswith("llamacpp:requests_deferred"))))


def test_a_request_waits_at_most_queue_timeout_then_503_with_retry_after(smollm2: Path, servers) -> None:
    srv = servers.start(smollm2, ctx_size=2048, parallel=4, queue_timeout=2, metrics=True)
    holder = _hold(srv.base_url, prose(900, 1), 600)  # ~1,800 of the 2,048 tokens for a while
    time.sleep(3)
    started = time.monotonic()
    response = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": prose(500, 2)}], "max_tokens": 200, "temperature": 0})
    waited = time.monotonic() - started
    assert response.status_code == 503, response.text
    assert 1.8 <= waited < 30 and int(response.headers["Retry-After"]) >= 1
    assert "wait" in response.json()["error"]["message"]
    holder.join(timeout=300)


def test_clients_that_disconnect_free_their_place_at_once(smollm2: Path, servers) -> None:
    """A client that gives up while waiting leaves the queue; one that disconnects while streaming frees its
    slot and its share of the pool: the next waiting request starts without waiting for either's max_tokens."""
    srv = servers.start(smollm2, ctx_size=2048, parallel=4, metrics=True)
    # ignore_eos: the holder keeps its ~2,000 tokens of the pool until its client leaves, whatever the model says
    body = {"messages": [{"role": "user", "content": prose(300, 3)}], "max_tokens": 1700, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=None) as streaming:
        with streaming.stream("POST", srv.base_url + "/v1/chat/completions", json=body) as holder:
            lines = holder.iter_lines()  # kept: a discarded line iterator closes the connection (httpcore)
            assert holder.status_code == 200 and next(lines).startswith("data: ")  # it streams: ~2,000 of the pool's 2,048 tokens
            waiter = httpx.Client(timeout=1.5)
            with pytest.raises(httpx.ReadTimeout):  # waits for room, then gives up
                waiter.post(srv.base_url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": prose(600, 4)}], "max_tokens": 400})
            waiter.close()
            deadline = time.monotonic() + 10
            while _waiting(srv.base_url) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _waiting(srv.base_url) == 0, "the client that gave up is still queued"
            queued = threading.Thread(target=lambda: chat(srv.base_url, prose(600, 5), 32), daemon=True)
            queued.start()
            time.sleep(2)
            assert _waiting(srv.base_url) == 1
        started = time.monotonic()  # the streaming client is gone
        queued.join(timeout=120)
        assert not queued.is_alive() and time.monotonic() - started < 60


def test_kill_9_with_requests_waiting_restarts_and_clients_get_a_clean_error(smollm2: Path, pyllm_home: Path) -> None:
    """Detached: kill -9 of llama-server while one request holds the pool and others wait. The supervisor
    restarts it; every client gets an error (no hang), and the restarted server answers."""
    result = run_pyllm("serve", str(smollm2), "--port", "0", "--detach", "--ctx-size", "2048", "--parallel", "4", timeout=300)
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
    url = entry["url"]
    outcomes: list[str] = []

    def client(seed: int) -> None:
        try:
            chat(url, prose(800, seed), 500)
            outcomes.append("ok")
        except Exception as exc:  # the clean error the test wants: raised, not hung
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.5)
    time.sleep(3)
    os.kill(entry["server_pid"], signal.SIGKILL)
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client hangs"
    assert len(outcomes) == 4 and outcomes.count("ok") < 4, outcomes
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
        if entry["status"] == "ready" and entry["restarts"] == 1:
            break
        time.sleep(1)
    assert entry["status"] == "ready" and entry["restarts"] == 1, entry
    assert chat(url, "Hello", 8)["text"]
    run_pyllm("stop", entry["name"], check=True)


class _serve_cli:
    """`pyllm serve MODEL --port 0` in the foreground, as a user starts it; stopped with Ctrl-C."""

    def __init__(self, model: Path, *args: str) -> None:
        self.args = ["serve", str(model), "--port", "0", *args]

    def __enter__(self):
        import subprocess

        from conftest import PYLLM

        self.proc = subprocess.Popen([str(PYLLM), *self.args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            lines.append(line)
            if not line and self.proc.poll() is not None:
                break
            if line.startswith("started llama-server"):
                break
        # ready once ps says so
        while time.monotonic() < deadline:
            entries = json.loads(run_pyllm("ps", "--json", check=True).stdout)
            if entries and entries[0].get("status") == "ready":
                return entries[0]["name"], "".join(lines)
            time.sleep(0.5)
        raise AssertionError("pyllm serve did not become ready: " + "".join(lines))

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except Exception:
            self.proc.kill()
