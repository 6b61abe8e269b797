"""The prefill lane (patch 0049, llama-server --prefill-lane N): a long prompt is prefilled in a second llama_context
on its own thread while the slots keep decoding, then its KV state moves into its slot, which samples and decodes
as usual.

Real llama-server (CPU build), real SmolLM2 and synthetic DeepSeek-V4 / GLM-DSA models, real HTTP: the answers of a
lane-prefilled prompt against the same server with the lane off, a stream beside the lane, the lane's requests
cancelled, stopped with SIGTERM, overlapping and too long for it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import wait_for

WORDS = ("river stone lantern maple orbit copper violet harbor meadow signal quartz ember falcon tundra willow "
         "cobalt prism thistle canyon summit glacier beacon saffron juniper marble velvet compass horizon").split()

# a prompt of at least LANE tokens left to compute (after the prompt cache) goes to the lane
LANE = 256


def prompt(srv, n_tokens: int, seed: int) -> list[int]:
    """n_tokens token ids of varied text (different seeds share no prefix the prompt cache could reuse)."""
    words, x = [], seed * 7919 + 13
    for i in range(2 * n_tokens):
        x = (x * 1103515245 + 12345) % 2**31
        words.append(WORDS[x % len(WORDS)] + (f" ({i}).\n" if i % 17 == 16 else ""))
    tokens = httpx.post(srv.base_url + "/tokenize", json={"content": " ".join(words)}, timeout=60).json()["tokens"]
    assert len(tokens) >= n_tokens
    return tokens[:n_tokens]


def complete(srv, tokens: list[int], n_predict: int = 8, **extra) -> dict:
    """Greedy /completion with the top-5 log-probs of every token."""
    body = {"prompt": tokens, "n_predict": n_predict, "temperature": 0, "n_probs": 5, "cache_prompt": True, **extra}
    reply = httpx.post(srv.base_url + "/completion", json=body, timeout=600)
    reply.raise_for_status()
    return reply.json()


def logprobs(reply: dict) -> list[tuple[int, list[tuple[int, float]]]]:
    return [(p["id"], [(t["id"], t["logprob"]) for t in p["top_logprobs"]]) for p in reply["completion_probabilities"]]


def metrics(srv) -> dict[str, float]:
    text = httpx.get(srv.base_url + "/metrics", timeout=30).text
    return {k.removeprefix("llamacpp:"): float(v) for k, v in (line.split() for line in text.splitlines()
                                                               if line.startswith("llamacpp:"))}


def slot_states(srv) -> list[str]:
    return [s["state"] for s in httpx.get(srv.base_url + "/slots", timeout=30).json()]


def start(servers, model: Path, lane: int, *, parallel: int = 4, ctx: int = 16384, kv_unified: bool = True, extra=()):
    return servers.start(model, parallel=parallel, ctx_size=ctx, kv_unified=kv_unified,
                         extra_args=["--prefill-lane", str(lane), *extra])


@pytest.mark.parametrize("preset,n,kv_unified", [
    ("smollm2", 800, True),           # pyllm serve's layout: one shared pool
    ("tiny-glm-dsa", 800, False),     # a KV stream per slot: the lane's one-stream state lands in its slot's stream
    ("tiny-deepseek4", 1200, False),  # compressed caches, sliding window, context checkpoints
])
def test_a_lane_prompt_answers_as_in_its_slot(preset: str, n: int, kv_unified: bool, smollm2: Path,
                                              tiny_models: dict[str, Path], servers) -> None:
    """Greedy answers, and the first token's top-5 log-probs bit for bit, equal the lane-off server's: fresh, and again
    when the next request extends the prompt (its cached prefix is copied into the lane, the lane computes the rest).
    A model without a sliding window matches in every log-prob; DeepSeek-V4's restored window is summed in another
    cell order after the first token, as after the pin's own checkpoint restore (low bits, same tokens)."""
    model = smollm2 if preset == "smollm2" else tiny_models[preset]
    on = start(servers, model, LANE, kv_unified=kv_unified)
    off = start(servers, model, 0, kv_unified=kv_unified)
    first = prompt(on, n, seed=1)
    longer = first + prompt(on, 700, seed=2)  # more than one micro-batch (-b 512): the lane takes all but the last
    replies = {}
    for name, srv in (("on", on), ("off", off)):
        replies[name] = [complete(srv, first), complete(srv, longer)]
    for a, b in zip(replies["on"], replies["off"]):
        assert [t for t, _ in logprobs(a)] == [t for t, _ in logprobs(b)], (a["content"], b["content"])
        assert logprobs(a)[0] == logprobs(b)[0]
        if preset != "tiny-deepseek4":
            assert logprobs(a) == logprobs(b)
    assert replies["on"][1]["timings"]["cache_n"] == replies["off"][1]["timings"]["cache_n"] > n // 2
    m = metrics(on)
    assert m["prefill_lane_prompts_total"] == 2 and m["prefill_lane_tokens_total"] > n, m
    assert m["prefill_lane_busy"] == 0 and m["prefill_lane_handoff_ms"] > 0
    assert metrics(off)["prefill_lane_prompts_total"] == 0


def test_a_stream_keeps_decoding_while_the_lane_prefills(smollm2: Path, servers) -> None:
    """A stream decodes while a 1,600-token prompt is prefilled in the lane: it gets tokens all along (the slots' loop
    never stops for the prefill; the one step the stream waits is the prompt's last micro-batch, 64 tokens here, in
    its slot), and the long request's first token is the one it gets alone, to the log-prob: that micro-batch runs in
    a step of its own, in a KV stream of its slot's own (in a shared pool its cells would lie elsewhere than alone,
    which changes the sums' rounding, with or without the lane)."""
    # llama.cpp's own scheduling beside the lane (pyllm serve's --decode-latency-target would bound it)
    srv = start(servers, smollm2, LANE, kv_unified=False, extra=["--decode-latency-target", "0"])
    long = prompt(srv, 1600, seed=3)  # pyllm serve's -b 512: [0, 1536) in the lane, [1536, 1600) in the slot
    times: list[float] = []
    done = threading.Event()

    def stream() -> None:
        body = {"prompt": prompt(srv, 32, seed=4), "n_predict": 4000, "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", srv.base_url + "/completion", json=body, timeout=600) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                    times.append(time.monotonic())
                if done.is_set():
                    return

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    wait_for(lambda: len(times) >= 5, 60, "the stream's first tokens")
    t0 = time.monotonic()
    beside = complete(srv, long)
    t1 = time.monotonic()
    done.set()
    during = [t for t in times if t0 <= t <= t1]
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert metrics(srv)["prefill_lane_prompts_total"] == 1
    assert len(during) >= 20 and max(gaps) < (t1 - t0) / 4, (len(during), max(gaps, default=None), t1 - t0)
    streamer.join(30)
    alone = complete(start(servers, smollm2, 0, kv_unified=False), long)
    assert logprobs(beside)[0] == logprobs(alone)[0]


def _send_and_drop(srv, tokens: list[int]) -> None:
    """A streamed request whose client goes away once the lane holds its prompt."""
    body = json.dumps({"prompt": tokens, "n_predict": 8, "stream": True}).encode()
    with socket.create_connection((srv.host_for_clients, srv.config.port)) as sock:
        sock.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        wait_for(lambda: "prefill_lane" in slot_states(srv), 60, "the lane to take the prompt")


def test_a_request_cancelled_in_the_lane_frees_its_slot_and_runs_again(tiny_deepseek4: Path, servers) -> None:
    srv = start(servers, tiny_deepseek4, LANE)
    tokens = prompt(srv, 3000, seed=5)
    _send_and_drop(srv, tokens)
    wait_for(lambda: slot_states(srv) == ["idle"] * 4, 30, "the slot to be released once the lane let go of it")
    assert metrics(srv)["prefill_lane_busy"] == 0
    again = complete(srv, tokens)
    assert again["tokens_predicted"] == 8
    assert metrics(srv)["prefill_lane_prompts_total"] == 1


def test_sigterm_while_the_lane_computes_exits_at_once(tiny_deepseek4: Path, servers) -> None:
    """No hang, no crash: the lane's compute is stopped, its request gets 503, the server exits 0."""
    srv = start(servers, tiny_deepseek4, LANE)
    tokens = prompt(srv, 3000, seed=6)
    got: dict = {}

    def request() -> None:
        try:
            got["status"] = httpx.post(srv.base_url + "/completion", json={"prompt": tokens, "n_predict": 8},
                                       timeout=120).status_code
        except httpx.HTTPError as e:
            got["error"] = repr(e)

    client = threading.Thread(target=request)
    client.start()
    wait_for(lambda: "prefill_lane" in slot_states(srv), 60, "the lane to take the prompt")
    t0 = time.monotonic()
    srv.stop(timeout=20)  # SIGTERM
    assert srv.proc.returncode == 0 and time.monotonic() - t0 < 10, (srv.proc.returncode, time.monotonic() - t0)
    client.join(30)
    assert got == {"status": 503}, got


def test_two_long_prompts_one_in_the_lane_one_in_its_slot(tiny_deepseek4: Path, servers) -> None:
    """One lane: the second long prompt is processed in its slot meanwhile; both answer as on the lane-off server."""
    srv = start(servers, tiny_deepseek4, LANE)
    prompts = [prompt(srv, 2000, seed=7), prompt(srv, 2000, seed=8)]
    replies: list = [None, None]
    states: set = set()

    def request(i: int) -> None:
        replies[i] = complete(srv, prompts[i])

    threads = [threading.Thread(target=request, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        states.add(tuple(sorted(slot_states(srv))))
        time.sleep(0.05)
    assert any("prefill_lane" in s and "processing_prompt" in s for s in states), states
    assert metrics(srv)["prefill_lane_prompts_total"] == 1
    off = start(servers, tiny_deepseek4, 0)
    assert [r["tokens"] for r in replies] == [complete(off, p)["tokens"] for p in prompts]


def test_a_prompt_longer_than_the_lane_goes_to_its_slot(tiny_deepseek4: Path, servers) -> None:
    srv = start(servers, tiny_deepseek4, LANE, extra=["--prefill-lane-ctx", "1024"])
    assert complete(srv, prompt(srv, 1500, seed=9))["tokens_predicted"] == 8
    assert metrics(srv)["prefill_lane_prompts_total"] == 0
    assert complete(srv, prompt(srv, 900, seed=10))["tokens_predicted"] == 8
    assert metrics(srv)["prefill_lane_prompts_total"] == 1


def test_short_streams_beside_long_prompts_all_complete(tiny_deepseek4: Path, servers) -> None:
    """12 short streams beside 3 long prompts (one lane: the others in their slots): no request fails."""
    from concurrent.futures import ThreadPoolExecutor

    srv = start(servers, tiny_deepseek4, LANE, parallel=16, ctx=16 * 4096)
    longs = [prompt(srv, 2000, seed=20 + i) for i in range(3)]
    short = prompt(srv, 40, seed=30)

    def stream() -> int:
        body = {"prompt": short, "n_predict": 40, "stream": True, "ignore_eos": True}
        last = {}
        with httpx.stream("POST", srv.base_url + "/completion", json=body, timeout=600) as reply:
            reply.raise_for_status()
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    last = json.loads(line[6:])
        return last.get("tokens_predicted", 0)

    with ThreadPoolExecutor(max_workers=15) as pool:
        streams = [pool.submit(stream) for _ in range(12)]
        long = [pool.submit(complete, srv, p) for p in longs]
        assert [f.result() for f in streams] == [40] * 12
        assert [f.result()["tokens_predicted"] for f in long] == [8] * 3
    assert metrics(srv)["prefill_lane_prompts_total"] >= 1


@pytest.mark.parametrize("args,says", [
    (["--prefill-lane", "5x"], "invalid value '5x': --prefill-lane takes a whole number of prompt tokens from 0 (off) to 1073741824"),
    (["--prefill-lane", "-1"], "invalid value '-1': --prefill-lane takes a whole number of prompt tokens from 0 (off) to 1073741824"),
    (["--prefill-lane-ctx", "1k"], "invalid value '1k': --prefill-lane-ctx takes a whole number of tokens from 1 to 1073741824 (0 = the context of one slot)"),
])
def test_llama_server_refuses_a_bad_lane_value_in_one_line(args: list[str], says: str) -> None:
    from pyllm_a100.llamacpp.native import binary

    result = subprocess.run([str(binary("llama-server")), *args], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and says in result.stderr, result.stderr


def test_a_lane_too_small_for_its_threshold_stops_the_start(tiny_deepseek4: Path) -> None:
    from pyllm_a100.llamacpp.native import binary

    result = subprocess.run([str(binary("llama-server")), "-m", str(tiny_deepseek4), "--port", "0", "-np", "2",
                             "--prefill-lane", "2048", "--prefill-lane-ctx", "1024"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    assert ("the prefill lane holds 1024 tokens (--prefill-lane-ctx, at most the context of one slot), fewer than the "
            "2048 a prompt needs to use it (--prefill-lane)") in result.stderr, result.stderr[-2000:]
