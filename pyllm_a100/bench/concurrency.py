"""`pyllm bench --concurrency 1,4,8,16,32`: what a llama-server gives N streams at once.

Per level N, N clients each send ``requests_per_stream`` streamed completions back to back
(token-id prompts of an exact length, ``ignore_eos``, no prompt cache). Figures per level:
aggregate generated tokens/s (all tokens / wall time), per-stream tokens/s (median over
requests of llama-server's own ``predicted_per_second``, i.e. what one user sees while the
others share the batch), time to first token p50/p99 (first streamed content chunk, measured
here), requests and failures. With a model file, one managed server per ``--parallel`` value
measures every level, so the ratios sit side by side in one run.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from .client import BenchError, Streamed, _vocab_size, check_ready, stream_completion

log = logging.getLogger(__name__)

DEFAULT_LEVELS = (1, 4, 8, 16, 32)
MAX_LEVEL = 1024


def parse_levels(text: str, *, option: str = "--concurrency") -> list[int]:
    """``"1,4,8"`` -> ``[1, 4, 8]`` (a single ``"4"`` stays valid); every level >= 1, no repeats."""
    parts = [p.strip() for p in str(text).split(",")]
    if not text or any(not p for p in parts):
        raise BenchError(f"{option} {text!r}: give whole numbers separated by commas, e.g. {option} 1,4,8,16")
    levels = []
    for p in parts:
        if not p.isdigit():
            raise BenchError(f"{option} {text!r}: {p!r} is not a whole number; e.g. {option} 1,4,8,16")
        n = int(p)
        if not 1 <= n <= MAX_LEVEL:
            raise BenchError(f"{option} {text!r}: {n} is out of range; every value must be 1..{MAX_LEVEL}")
        if n in levels:
            raise BenchError(f"{option} {text!r}: {n} is given twice; list each value once")
        levels.append(n)
    return levels


@dataclasses.dataclass(frozen=True)
class Slots:
    """How a benchmarked server serves requests at once: ``--parallel`` (None: not given) and whether
    the slots share one KV pool (``--kv-unified``) or each gets ctx / parallel tokens (llama-server's
    default with an explicit --parallel)."""

    parallel: int | None = None
    unified: bool = False

    @property
    def label(self) -> str:
        return "default" if self.parallel is None else f"{self.parallel}{'u' if self.unified else ''}"

    def server_options(self, ctx_size: int) -> dict[str, Any]:
        """Server options for this setting: N and Nu exactly (``kv_unified``: no memory plan, the benchmark wants
        these slots), the default pyllm serve's planned pool at ``ctx_size``."""
        if self.parallel is None:
            return {"ctx_size": ctx_size}
        return {"ctx_size": ctx_size, "parallel": self.parallel, "kv_unified": self.unified}


def parse_parallel(text: str) -> list[Slots]:
    """``"default,16,32u"`` -> server slot settings to compare: ``default`` (pyllm serve's), ``N`` (N slots,
    the context split between them), ``Nu`` (N slots sharing one KV pool, --kv-unified)."""
    parts = [p.strip() for p in str(text).split(",")]
    out: list[Slots] = []
    for p in parts:
        if not p:
            raise BenchError(f"--parallel {text!r}: give slot counts separated by commas, e.g. --parallel default,16,32")
        unified = p.endswith("u") and p != "default"
        value = Slots() if p == "default" else Slots(parse_levels(p[:-1] if unified else p, option="--parallel")[0], unified)
        if value in out:
            raise BenchError(f"--parallel {text!r}: {p} is given twice; list each value once")
        out.append(value)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): an observed value, so p99 >= p50 always holds."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclasses.dataclass
class LevelResult:
    concurrency: int
    slots: str  # Slots.label of the server: default, N or Nu (N slots sharing one KV pool)
    requests: int  # completed
    failures: int
    generated_tokens: int
    wall_s: float
    aggregate_tps: float  # all generated tokens / wall time
    per_stream_tps: float  # median of llama-server's predicted_per_second over the requests
    ttft_p50_s: float
    ttft_p99_s: float
    first_error: str | None = None

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def reach(url: str, api_key: str | None) -> tuple[str, dict, httpx.Limits, int]:
    """A ready llama-server at ``url``: (its base URL, request headers, connection limits, vocabulary size)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = url.rstrip("/").removesuffix("/v1")
    fresh = httpx.Limits(max_keepalive_connections=0)  # one connection per request, as separate clients would
    with httpx.Client(headers=headers, limits=fresh) as client:
        check_ready(client, url)
        return url, headers, fresh, _vocab_size(client, url)


def wave(url: str, headers: dict, limits: httpx.Limits, prompts: list[list[list[int]]], gen_tokens: int, *,
         cache_prompt: bool = False) -> tuple[list[Streamed], list[str], float]:
    """One client thread per entry of ``prompts``, each sending its prompts back to back: (done, errors, wall s)."""
    done: list[Streamed] = []
    errors: list[str] = []
    lock = threading.Lock()

    def stream(mine: list[list[int]]) -> None:
        with httpx.Client(headers=headers, limits=limits) as own:
            for p in mine:
                try:
                    result = stream_completion(own, url, p, gen_tokens, cache_prompt=cache_prompt)
                except Exception as exc:  # counted as a failure of this wave
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with lock:
                    done.append(result)

    started = time.perf_counter()
    threads = [threading.Thread(target=stream, args=(mine,), daemon=True) for mine in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done, errors, time.perf_counter() - started


def measure(url: str, levels: Sequence[int], *, prompt_tokens: int = 256, gen_tokens: int = 64,
            requests_per_stream: int = 2, slots: str = "-", api_key: str | None = None, seed: int = 0,
            on_level: Callable[[LevelResult], None] | None = None,
            on_level_start: Callable[[int], None] | None = None) -> list[LevelResult]:
    """Every level against one running server (warm-ups first, not counted: one request alone, then one
    request per stream of the highest level).

    ``slots`` is only recorded (how the server at ``url`` was started); failed requests
    are counted, not raised, so one bad level does not hide the others. ``on_level_start(n)`` runs just
    before level n's requests, ``on_level(row)`` just after (e.g. to read a counter of the server's around it).
    """
    if prompt_tokens < 1 or gen_tokens < 1 or requests_per_stream < 1:
        raise BenchError("--prompt-tokens, --gen-tokens and --repeat must be at least 1")
    if not levels or any(n < 1 for n in levels):
        raise BenchError("--concurrency: give at least one level, each at least 1")
    url, headers, fresh, n_vocab = reach(url, api_key)
    rng = random.Random(seed)

    def prompt() -> list[int]:
        return [rng.randrange(10, max(11, n_vocab - 1)) for _ in range(prompt_tokens)]

    with httpx.Client(headers=headers, limits=fresh) as client:
        stream_completion(client, url, prompt(), min(gen_tokens, 8))  # first-use costs (JIT, allocations) stay out
    out = []
    # Warm-up at the highest level too, not counted: batched kernels are compiled on first use (PTX JIT
    # on GPUs newer than the build), which would otherwise land in whichever level needs them first.
    wave(url, headers, fresh, [[prompt()] for _ in range(max(levels))], min(gen_tokens, 8))
    for n in levels:
        prompts = [[prompt() for _ in range(requests_per_stream)] for _ in range(n)]
        if on_level_start:
            on_level_start(n)
        done, errors, wall = wave(url, headers, fresh, prompts, gen_tokens)
        generated = sum(int(d.timings.get("predicted_n", 0)) for d in done)
        ttfts = [d.ttft_s for d in done]
        row = LevelResult(
            concurrency=n, slots=slots, requests=len(done), failures=len(errors), generated_tokens=generated,
            wall_s=wall, aggregate_tps=generated / wall if wall > 0 else 0.0,
            per_stream_tps=statistics.median(float(d.timings.get("predicted_per_second", 0.0)) for d in done) if done else 0.0,
            ttft_p50_s=percentile(ttfts, 50), ttft_p99_s=percentile(ttfts, 99), first_error=errors[0] if errors else None)
        log.info("concurrency %d (slots %s): %.1f tok/s aggregate, %d failures", n, slots, row.aggregate_tps, len(errors))
        out.append(row)
        if on_level:
            on_level(row)
    return out


def slot_context(prompt_tokens: int, gen_tokens: int) -> int:
    """Context one slot needs for a benchmark request, rounded up to 256 tokens with room to spare."""
    return (prompt_tokens + gen_tokens + 64 + 255) // 256 * 256


def server_ctx(slots: Slots, per_slot: int) -> int:
    """--ctx-size giving every slot ``per_slot`` tokens: with an explicit --parallel llama-server splits the
    context between the slots; a unified pool (also llama-server's own choice) is shared, so the same total."""
    from ..serve.options import DEFAULT_PARALLEL
    from ..planning.capacity import AUTO_SLOTS

    return per_slot * (slots.parallel or DEFAULT_PARALLEL or AUTO_SLOTS)


def serve_and_measure(model: Any, levels: Sequence[int], variants: Sequence[Slots], *, prompt_tokens: int = 256,
                      gen_tokens: int = 64, requests_per_stream: int = 2, ctx_per_slot: int | None = None,
                      on_level: Callable[[LevelResult], None] | None = None,
                      on_server: Callable[[str, list[str]], None] | None = None, **server_options: Any
                      ) -> list[LevelResult]:
    """One managed server per slot setting, every level on each, in one run."""
    from ..serve.server import Server

    per_slot = slot_context(prompt_tokens, gen_tokens) if ctx_per_slot is None else ctx_per_slot
    if per_slot < prompt_tokens + gen_tokens:
        raise BenchError(f"--ctx-per-slot {per_slot} is less than --prompt-tokens + --gen-tokens "
                         f"({prompt_tokens + gen_tokens}): raise it or leave it out")
    rows: list[LevelResult] = []
    ready_timeout = server_options.pop("ready_timeout", 3600)
    extra = list(server_options.pop("extra_args", ()))
    for slots in variants:
        with Server(model, port=0, ready_timeout=ready_timeout, extra_args=extra,
                    **slots.server_options(server_ctx(slots, per_slot)), **server_options) as srv:
            if on_server:
                on_server(slots.label, list(srv.argv[1:]))
            rows += measure(srv.base_url, levels, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                            requests_per_stream=requests_per_stream, slots=slots.label, on_level=on_level)
    return rows


def scaling(rows: Sequence[LevelResult]) -> dict[tuple[str, int], float]:
    """Aggregate at N / aggregate at the lowest level measured on the same server (1 stream when measured)."""
    out = {}
    for slots in dict.fromkeys(r.slots for r in rows):
        mine = [r for r in rows if r.slots == slots]
        base = min(mine, key=lambda r: r.concurrency)
        for r in mine:
            out[(slots, r.concurrency)] = r.aggregate_tps / base.aggregate_tps if base.aggregate_tps else math.nan
    return out
