"""`pyllm bench run`: one llama-server (a URL, or a model served for the run) at one concurrency.

Throughput under concurrency is generated tokens / wall time; prefill and decode speeds are llama-server's own.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import threading
import time
from typing import Any

import httpx

from .client import BenchError, Streamed, _vocab_size, check_ready, stream_completion


@dataclasses.dataclass
class BenchResult:
    url: str
    prompt_tokens: int
    gen_tokens: int
    concurrency: int
    requests: int
    prefill_tps: float  # median over requests, llama-server's prompt_per_second
    decode_tps: float  # median, predicted_per_second (one request's decode speed)
    ttft_s: float  # median time to first streamed token
    throughput_tps: float  # all generated tokens / wall time (the concurrency figure)
    wall_s: float

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run(url: str, *, prompt_tokens: int = 512, gen_tokens: int = 128, concurrency: int = 1, repeat: int = 3,
        api_key: str | None = None, seed: int = 0) -> BenchResult:
    """Benchmark a running llama-server (warm-up request first, not counted)."""
    if prompt_tokens < 1 or gen_tokens < 1 or concurrency < 1 or repeat < 1:
        raise BenchError("--prompt-tokens, --gen-tokens, --concurrency and --repeat must be at least 1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = url.rstrip("/").removesuffix("/v1")
    # one connection per request, as separate clients would (no request waits behind another on a shared socket)
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(headers=headers, limits=fresh) as client:
        check_ready(client, url)
        n_vocab = _vocab_size(client, url)
        rng = random.Random(seed)

        def prompt() -> list[int]:
            return [rng.randrange(10, max(11, n_vocab - 1)) for _ in range(prompt_tokens)]

        stream_completion(client, url, prompt(), min(gen_tokens, 8))  # warm-up: first-use costs (JIT, allocations) stay out
        results: list[Streamed] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        prompts = [[prompt() for _ in range(repeat)] for _ in range(concurrency)]

        def worker(i: int) -> None:
            with httpx.Client(headers=headers, limits=fresh) as own:
                for p in prompts[i]:
                    try:
                        out = stream_completion(own, url, p, gen_tokens)
                    except BaseException as exc:  # collected and raised below
                        errors.append(exc)
                        return
                    with lock:
                        results.append(out)

        started = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
    if errors:
        raise BenchError(f"{len(errors)} request(s) failed: {errors[0]}")
    generated = sum(r.timings.get("predicted_n", 0) for r in results)
    return BenchResult(
        url=url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=concurrency, requests=len(results),
        prefill_tps=statistics.median(r.timings.get("prompt_per_second", 0.0) for r in results),
        decode_tps=statistics.median(r.timings.get("predicted_per_second", 0.0) for r in results),
        ttft_s=statistics.median(r.ttft_s for r in results), throughput_tps=generated / wall, wall_s=wall,
    )


def serve_and_run(model: Any, *, prompt_tokens: int = 512, gen_tokens: int = 128, concurrency: int = 1, repeat: int = 3,
                  ctx_size: int | None = None, tensor_split: str | None = None) -> BenchResult:
    """:func:`run` against a managed server of ``model`` started for it (one slot per client), stopped after."""
    from ..serve.server import Server

    with Server(model, port=0, ctx_size=ctx_size or 4096, tensor_split=tensor_split, parallel=concurrency,
                ready_timeout=3600) as server:
        return run(server.base_url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=concurrency,
                   repeat=repeat)
