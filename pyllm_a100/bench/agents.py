"""An agent team's load on one server: a long shared system prompt, a tail of its own per request, many clients.

What coding agents do to a team server: every request repeats a long prefix (instructions, tools, the repository's
context) and adds its own tail, and many arrive at once. Per concurrency level: time to first token p50/p99,
aggregate generated tokens/s, the share of prompt tokens the server's prompt cache reused (llama-server's
``cache_n`` against ``cache_n + prompt_n``), and failed requests with the first error. :func:`compare` starts
``pyllm serve``'s defaults and a baseline (llama.cpp's own settings: ``--parallel 16 --kv-unified`` at a
16384-token pool, or any llama-server binary) on the same model, one after the other in the same run.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from .concurrency import percentile, reach, wave
from .client import BenchError, stream_completion

log = logging.getLogger(__name__)

BASELINE_ARGS = ("--parallel", "16", "--kv-unified", "--ctx-size", "16384")  # llama.cpp's team setting, pyllm's before


@dataclasses.dataclass(frozen=True)
class Load:
    system_tokens: int = 2048  # the shared prefix
    tail_tokens: int = 256  # each request's own part
    gen_tokens: int = 64
    requests_per_client: int = 2

    def check(self) -> None:
        if min(self.system_tokens, self.tail_tokens, self.gen_tokens, self.requests_per_client) < 1:
            raise BenchError("--system-tokens, --tail-tokens, --gen-tokens and --repeat must be at least 1")


@dataclasses.dataclass
class AgentLevel:
    server: str  # which server: "pyllm serve" or the baseline's label
    clients: int
    requests: int  # completed
    failures: int
    wall_s: float
    aggregate_tps: float
    ttft_p50_s: float
    ttft_p99_s: float
    prompt_reused: float  # share of prompt tokens served from the prompt cache
    first_error: str | None = None

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measure(url: str, levels: Sequence[int], load: Load, *, server: str = "-", api_key: str | None = None, seed: int = 0,
            on_level: Callable[[AgentLevel], None] | None = None) -> list[AgentLevel]:
    """Each level of clients against one running server; failed requests are counted, not raised."""
    load.check()
    if not levels or min(levels) < 1:
        raise BenchError("--concurrency: give at least one level, each at least 1")
    url, headers, fresh, n_vocab = reach(url, api_key)
    rng = random.Random(seed)
    system = [rng.randrange(10, max(11, n_vocab - 1)) for _ in range(load.system_tokens)]
    with httpx.Client(headers=headers, limits=fresh) as client:
        stream_completion(client, url, system + [11] * 8, 4, cache_prompt=True)  # warm-up, not counted: first-use costs stay out
    out = []
    for n in levels:
        prompts = [[system + [rng.randrange(10, max(11, n_vocab - 1)) for _ in range(load.tail_tokens)]
                    for _ in range(load.requests_per_client)] for _ in range(n)]
        done, errors, wall = wave(url, headers, fresh, prompts, load.gen_tokens, cache_prompt=True)
        generated = sum(int(d.timings.get("predicted_n", 0)) for d in done)
        cached = sum(int(d.timings.get("cache_n", 0)) for d in done)
        processed = sum(int(d.timings.get("prompt_n", 0)) for d in done)
        ttfts = [d.ttft_s for d in done]
        row = AgentLevel(server=server, clients=n, requests=len(done), failures=len(errors), wall_s=wall,
                         aggregate_tps=generated / wall if wall > 0 else 0.0, ttft_p50_s=percentile(ttfts, 50),
                         ttft_p99_s=percentile(ttfts, 99), prompt_reused=cached / (cached + processed) if cached + processed else 0.0,
                         first_error=errors[0] if errors else None)
        log.info("%s, %d clients: %.1f tok/s, %d failures", server, n, row.aggregate_tps, row.failures)
        out.append(row)
        if on_level:
            on_level(row)
    return out


def compare(model: Any, levels: Sequence[int], load: Load, *, baseline_args: Sequence[str] = BASELINE_ARGS,
            baseline_binary: str | Path | None = None, on_level: Callable[[AgentLevel], None] | None = None,
            **server_options: Any) -> list[AgentLevel]:
    """pyllm serve's defaults, then the baseline (its own llama-server flags, optionally another binary), same model."""
    from ..serve.validate import check_server_binary
    from ..serve.server import Server

    if baseline_binary is not None:
        check_server_binary(baseline_binary)  # before pyllm serve's run, not after it
    rows: list[AgentLevel] = []
    label = "llama.cpp " + " ".join(baseline_args) + (f" ({Path(baseline_binary).name})" if baseline_binary else "")
    from ..serve.options import LLAMA_CPP_SCHEDULING

    # the baseline is llama.cpp's settings, and may be a build without our flags (the pin)
    runs = (("pyllm serve", [], None, {}),
            (label, list(baseline_args), baseline_binary, {"queue_timeout": None, **LLAMA_CPP_SCHEDULING}))
    for name, extra, binary, own in runs:
        with Server(model, port=0, ready_timeout=3600, extra_args=extra, server_binary=binary, **server_options, **own) as srv:
            rows += measure(srv.base_url, levels, load, server=name, api_key=srv.api_key, on_level=on_level)
    return rows


def ratios(rows: Sequence[AgentLevel]) -> list[str]:
    """Per client count measured on both servers: pyllm serve's figures over the baseline's, side by side."""
    first = rows[0].server if rows else ""
    ours = {r.clients: r for r in rows if r.server == first}
    out = []
    for r in rows:
        mine = ours.get(r.clients)
        if r.server == first or mine is None:
            continue
        tps = f"{mine.aggregate_tps / r.aggregate_tps:.2f}x" if r.aggregate_tps else "- (baseline generated nothing)"
        ttft = f"{mine.ttft_p50_s / r.ttft_p50_s:.2f}x" if r.ttft_p50_s else "-"
        out.append(f"{r.clients} clients, {first} / {r.server}: tokens/s {tps}, TTFT p50 {ttft}, "
                   f"completed {mine.requests} vs {r.requests}, failures {mine.failures} vs {r.failures}")
    return out
