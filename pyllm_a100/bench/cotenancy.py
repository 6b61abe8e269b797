"""Co-tenancy: what one user's long prompt does to everyone else's stream (`pyllm bench cotenancy`).

One stream decodes greedily (token ids, EOS ignored) while its every token's arrival is timed: first alone (its
solo tokens/s), then while ``prompts`` long prompts of ``prompt_tokens`` tokens are prefilled beside it. Also timed:
each long prompt's prefill (the time to its first token) and a short request's time to first token, sent once the
long prefill is under way. :func:`compare` runs this on `pyllm serve`'s defaults and on a baseline (this package's
llama-server with llama.cpp's own scheduling, or another binary) one after the other in the same run, so the
ratios sit side by side on the same machine.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from .concurrency import percentile, reach
from .client import BenchError, sse_data, stream_completion

log = logging.getLogger(__name__)

# The baseline: llama-server's own scheduling (every step fills up to -b 2048 prompt tokens beside the decoding slots,
# as the pin does: serve.options.LLAMA_CPP_SCHEDULING) on this package's llama-server, or another binary.
BASELINE_ARGS: tuple[str, ...] = ()
STREAM_PROMPT = 32  # tokens of the decoding stream's own prompt
SOLO_TOKENS = 48  # tokens timed while the stream decodes alone (after 8 not counted: its first steps)
SHORT_AFTER = 0.5  # seconds after the long prompts that the short request is sent
STREAM_MAX = 16384  # the most tokens the stream asks for: minutes of decoding even at full speed


@dataclasses.dataclass(frozen=True)
class Load:
    prompts: int = 1  # long prompts sent at once beside the stream
    prompt_tokens: int = 65536  # each long prompt's length
    short_tokens: int = 200  # the short request sent during the prefill (0: none)
    streams: int = 1  # streams decoding beside the long prompts (the first one is timed; agent traffic: 16)

    def check(self) -> None:
        if self.prompts < 1 or self.prompt_tokens < 1:
            raise BenchError(f"--prompts {self.prompts} --prompt-tokens {self.prompt_tokens}: both must be at least 1")
        if self.short_tokens < 0:
            raise BenchError(f"--short-tokens {self.short_tokens}: give a length, or 0 for no short request")
        if self.streams < 1:
            raise BenchError(f"--streams {self.streams}: at least the one stream that is timed")

    @property
    def slots(self) -> int:
        """Slots the server needs: the streams, every long prompt and the short request at once."""
        return self.streams + self.prompts + (1 if self.short_tokens else 0)


@dataclasses.dataclass
class CotenancyResult:
    server: str  # which server: "pyllm serve" or the baseline's label
    prompts: int
    prompt_tokens: int
    solo_tps: float  # the stream alone: tokens per second (1 / median inter-token gap)
    during_tps: float  # the stream's tokens per second while the long prompts are prefilled
    gap_p50_ms: float  # the stream's inter-token gaps during the prefill
    gap_p99_ms: float
    gap_max_ms: float
    prefill_s: float  # send to first token of the slowest long prompt
    short_ttft_s: float | None  # the short request's time to first token (None: not sent)
    stream_tokens: list[int]  # the stream's greedy tokens (the same with or without the scheduling, batch rounding aside)
    streams: int = 1  # streams decoding beside the long prompts (the timed one included)
    failures: int = 0  # the other streams that ended in an error

    def as_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row.pop("stream_tokens")
        return row

    @property
    def kept(self) -> float:
        """The stream's speed during the prefill as a share of its solo speed."""
        return self.during_tps / self.solo_tps if self.solo_tps else 0.0


class _Stream(threading.Thread):
    """The decoding stream: one streamed /completion, every token's arrival time kept, until stopped."""

    def __init__(self, url: str, headers: dict, prompt: list[int], n_predict: int) -> None:
        super().__init__(daemon=True)
        self.url, self.headers, self.prompt, self.n_predict = url, headers, prompt, n_predict
        self.arrivals: list[float] = []
        self.tokens: list[int] = []
        self.error: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        body = {"prompt": self.prompt, "n_predict": self.n_predict, "ignore_eos": True, "cache_prompt": False,
                "temperature": 0, "stream": True, "return_tokens": True}
        try:
            with httpx.Client(headers=self.headers, limits=httpx.Limits(max_keepalive_connections=0)) as client, \
                    client.stream("POST", self.url + "/completion", json=body, timeout=None) as response:
                if response.status_code != 200:
                    self.error = f"HTTP {response.status_code}: {response.read()[:200]!r}"
                    return
                for data in sse_data(response):
                    now = time.perf_counter()
                    chunk = json.loads(data)
                    if isinstance(chunk.get("error"), dict):
                        self.error = str(chunk["error"].get("message", chunk["error"]))
                        return
                    got = chunk.get("tokens") or []
                    self.tokens += got
                    self.arrivals += [now] * max(1, len(got)) if not chunk.get("stop") else []
                    if self.stop.is_set() or chunk.get("stop"):
                        return  # leaving the stream closes the connection: llama-server cancels the request
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def count(self) -> int:
        return len(self.arrivals)


def _gaps(arrivals: Sequence[float], start: float, end: float) -> list[float]:
    inside = [t for t in arrivals if start <= t <= end]
    return [b - a for a, b in zip(inside, inside[1:])]


def _wait_for(predicate: Callable[[], bool], stream: _Stream, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if stream.error or not stream.is_alive():
            raise BenchError(f"the decoding stream ended early ({stream.error or 'closed by the server'})")
        if time.monotonic() > deadline:
            raise BenchError(f"{what} took more than {timeout:.0f} s")
        time.sleep(0.005)


def measure(url: str, load: Load, *, server: str = "-", api_key: str | None = None, seed: int = 0,
            timeout: float = 3600) -> CotenancyResult:
    """One co-tenancy run against a running llama-server with at least ``load.slots`` free slots."""
    load.check()
    url, headers, fresh, n_vocab = reach(url, api_key)
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(10, max(11, n_vocab - 1)) for _ in range(n)]

    stream_prompt = tokens(STREAM_PROMPT)
    long_prompts = [tokens(load.prompt_tokens) for _ in range(load.prompts)]
    short = tokens(load.short_tokens) if load.short_tokens else None
    with httpx.Client(headers=headers, limits=fresh) as client:
        per_slot = _slot_tokens(client, url)
        if load.prompt_tokens + 8 > per_slot:
            raise BenchError(f"--prompt-tokens {load.prompt_tokens}: a slot of the server at {url} holds {per_slot} "
                             "tokens, prompt and reply: lower --prompt-tokens, or serve with more context per slot")
        stream_completion(client, url, tokens(16), 4)  # first-use costs (JIT, allocations) stay out
    # long enough to outlast the prefill (it is stopped as soon as the long prompts are done), within its slot, and
    # no more: a server that admits requests by their KV reservation (patch 0035) counts it against the pool
    n_predict = min(per_slot - STREAM_PROMPT - 1, STREAM_MAX)
    stream = _Stream(url, headers, stream_prompt, n_predict=n_predict)
    others = [_Stream(url, headers, tokens(STREAM_PROMPT), n_predict=n_predict) for _ in range(load.streams - 1)]
    stream.start()
    for other in others:
        other.start()
    try:
        _wait_for(lambda: stream.count() >= 8 + SOLO_TOKENS, stream, timeout, "decoding alone")
        solo = _gaps(stream.arrivals[8:], 0, float("inf"))
        results: dict[int, float] = {}  # each long prompt: send to first token (what its user waits)
        prefills: dict[int, tuple[float, float]] = {}  # each long prompt's prefill, as the server timed it
        errors: list[str] = []

        def send(i: int, prompt: list[int]) -> None:
            started = time.perf_counter()
            try:
                with httpx.Client(headers=headers, limits=fresh) as own:
                    done = stream_completion(own, url, prompt, 1)
                first = started + done.ttft_s
                results[i] = done.ttft_s
                prefills[i] = (first - float(done.timings.get("prompt_ms", 0.0)) / 1000, first)
            except Exception as exc:  # reported below
                errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                results.setdefault(i, time.perf_counter() - started)

        start = time.perf_counter()
        senders = [threading.Thread(target=send, args=(i, p), daemon=True) for i, p in enumerate(long_prompts)]
        for t in senders:
            t.start()
        short_ttft = None
        if short is not None:
            time.sleep(SHORT_AFTER)  # the long prefill is under way by then
            box: dict[int, float] = {}
            send_short = threading.Thread(target=lambda: box.update({0: _ttft(url, headers, fresh, short)}), daemon=True)
            send_short.start()
        for t in senders:
            t.join(timeout)
        end = time.perf_counter()
        if short is not None:
            send_short.join(timeout)
            short_ttft = box.get(0)
        if errors:
            raise BenchError(f"{len(errors)} long prompt(s) failed: {errors[0]}")
        stream.stop.set()
        _wait_for(lambda: not stream.is_alive() or stream.count() > 0, stream, 60, "stopping the stream")
    finally:
        for each in (stream, *others):
            each.stop.set()
    for other in others:
        other.join(60)
    # the window: from the first prefill's start to the last one's first token, as llama-server timed them (the
    # requests' upload and parsing before it are not the prefill); a gap that straddles a border counts
    begin = min((p[0] for p in prefills.values()), default=start)
    finish = max((p[1] for p in prefills.values()), default=end)
    before = [t for t in stream.arrivals if t < begin][-1:]
    after = [t for t in stream.arrivals if t > finish][:1]
    during = _gaps(before + [t for t in stream.arrivals if begin <= t <= finish] + after, 0, float("inf"))
    if not solo or len(during) < 2:
        raise BenchError(f"the stream got {len(during)} token(s) during the prefill: too few to measure; lengthen "
                         "--prompt-tokens")
    window = finish - begin
    return CotenancyResult(
        server=server, prompts=load.prompts, prompt_tokens=load.prompt_tokens,
        solo_tps=1 / percentile(solo, 50), during_tps=(len(during) - 1) / window if window > 0 else 0.0,
        gap_p50_ms=1000 * percentile(during, 50), gap_p99_ms=1000 * percentile(during, 99),
        gap_max_ms=1000 * max(during), prefill_s=max(results.values()), short_ttft_s=short_ttft,
        stream_tokens=list(stream.tokens), streams=load.streams, failures=sum(1 for o in others if o.error))


def _slot_tokens(client: httpx.Client, url: str) -> int:
    """The tokens one slot of the server holds (/props: default_generation_settings.n_ctx)."""
    try:
        props = client.get(url + "/props", timeout=30).json()
        return int(props["default_generation_settings"]["n_ctx"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{url}/props does not say how many tokens a slot holds ({type(exc).__name__}): is it a "
                         "llama-server?") from exc


def _ttft(url: str, headers: dict, limits: httpx.Limits, prompt: list[int]) -> float:
    with httpx.Client(headers=headers, limits=limits) as own:
        return stream_completion(own, url, prompt, 1).ttft_s


def compare(model: Any, load: Load, *, baseline_args: Sequence[str] = BASELINE_ARGS,
            baseline_binary: str | Path | None = None, server_args: Sequence[str] = (),
            on_result: Callable[[CotenancyResult], None] | None = None, **server_options: Any) -> list[CotenancyResult]:
    """`pyllm serve`'s defaults (plus ``server_args``), then the baseline, on the same model in one run."""
    from ..serve.validate import check_server_binary
    from ..serve.server import Server

    load.check()
    if baseline_binary is not None:
        check_server_binary(baseline_binary)  # before the first run, not after it
    from ..serve.options import LLAMA_CPP_SCHEDULING

    label = " ".join(["llama.cpp's scheduling", *baseline_args]) + (f" ({Path(baseline_binary).name})" if baseline_binary else "")
    own = dict(LLAMA_CPP_SCHEDULING, **({"queue_timeout": None} if baseline_binary else {}))  # another binary: the pin?
    runs = (("pyllm serve", list(server_args), None, {}), (label, list(baseline_args), baseline_binary, own))
    out = []
    for name, extra, binary, own in runs:
        options = {"parallel": load.slots, **server_options, **own}
        with Server(model, port=0, ready_timeout=3600, extra_args=extra, server_binary=binary, **options) as srv:
            result = measure(srv.base_url, load, server=name, api_key=srv.api_key)
        out.append(result)
        if on_result:
            on_result(result)
    return out


def same_tokens(rows: Sequence[CotenancyResult]) -> bool | None:
    """Whether the stream's greedy tokens agree between the runs, over the tokens every run got (None: one run)."""
    if len(rows) < 2:
        return None
    n = min(len(r.stream_tokens) for r in rows)
    return all(r.stream_tokens[:n] == rows[0].stream_tokens[:n] for r in rows[1:])


def ratios(rows: Sequence[CotenancyResult]) -> list[str]:
    """The first run against each other one, side by side: the stream's speed kept, the prefill's time, the short TTFT."""
    if len(rows) < 2:
        return []
    first = rows[0]
    out = []
    for r in rows[1:]:
        during = f"{first.during_tps / r.during_tps:.2f}x" if r.during_tps else "- (the baseline's stream got none)"
        short = (f", short-request TTFT {first.short_ttft_s:.2f} s vs {r.short_ttft_s:.2f} s"
                 if first.short_ttft_s is not None and r.short_ttft_s is not None else "")
        out.append(f"{first.server} / {r.server}: the stream during the prefill {during} ({first.kept:.0%} vs "
                   f"{r.kept:.0%} of solo), prefill time {first.prefill_s / r.prefill_s:.2f}x{short}")
    same = same_tokens(rows)
    if same is not None:
        out.append("the stream's greedy tokens: " + ("the same in every run" if same else
                   "they differ between runs (batch composition changes rounding: docs/performance.md)"))
    return out
