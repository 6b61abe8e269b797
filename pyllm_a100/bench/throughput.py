"""`pyllm bench` and `pyllm tune`: measure a llama-server instead of guessing its flags.

bench sends completion requests of exact lengths (token ids, ``ignore_eos``, no prompt
cache) and reads llama-server's own timings (``prompt_per_second``,
``predicted_per_second``); time to first token is measured on the stream; throughput
under concurrency is generated tokens / wall time. tune starts the model once per
candidate flag set (batch sizes, flash attention, and with several GPUs the split mode
and the number of GPUs) and reports the winner as a ready ``pyllm serve`` command.
"""

from __future__ import annotations

import dataclasses
import json
import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from ..errors import PyllmError


class BenchError(PyllmError, RuntimeError):
    """``http://127.0.0.1:8080 does not answer /health: start it (pyllm serve) or check --url``"""


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


def _vocab_size(client: httpx.Client, url: str) -> int:
    data = client.get(url + "/v1/models", timeout=30).json()
    for model in data.get("data", []):
        n = (model.get("meta") or {}).get("n_vocab")
        if n:
            return int(n)
    return 256


def sse_data(response: httpx.Response):
    """The ``data:`` payloads of a server-sent event stream, split on "\n" only.

    httpx's ``iter_lines`` splits like ``str.splitlines`` (also at U+0085, U+2028, \x1c ...),
    which llama-server writes unescaped inside JSON strings when a token decodes to them:
    random-weight models do, and the JSON of that line then arrives cut in two.
    """
    buffer = ""
    for text in response.iter_text():
        buffer += text
        *lines, buffer = buffer.split("\n")
        for line in lines:
            if line.startswith("data: "):
                yield line[6:].rstrip("\r")
    if buffer.startswith("data: "):
        yield buffer[6:].rstrip("\r")


@dataclasses.dataclass
class Streamed:
    timings: dict  # llama-server's timings of the request (its final chunk)
    ttft_s: float  # seconds to the first streamed content


def stream_completion(client: httpx.Client, url: str, prompt: list[int], gen: int, *, cache_prompt: bool = False) -> Streamed:
    """One streamed completion of ``gen`` tokens (EOS ignored; the prompt cache off unless ``cache_prompt``) -- every bench request."""
    started = time.perf_counter()
    first = None
    timings: dict = {}
    body = {"prompt": prompt, "n_predict": gen, "ignore_eos": True, "cache_prompt": cache_prompt, "temperature": 0, "stream": True}
    with client.stream("POST", url + "/completion", json=body, timeout=None) as response:
        if response.status_code != 200:
            raise BenchError(f"{url}/completion answered HTTP {response.status_code}: {response.read()[:200]!r}")
        for data in sse_data(response):
            chunk = json.loads(data)
            if isinstance(chunk.get("error"), dict):  # llama-server fails a started stream with an error chunk
                raise BenchError(f"llama-server: {chunk['error'].get('message', chunk['error'])}")
            if first is None and (chunk.get("content") or not chunk.get("stop")):
                first = time.perf_counter() - started
            if chunk.get("stop"):
                timings = chunk.get("timings") or {}
    if not timings:
        raise BenchError("the stream ended without llama-server's final chunk (timings)")
    return Streamed(timings, first if first is not None else time.perf_counter() - started)


def check_ready(client: httpx.Client, url: str) -> None:
    """One line when ``url`` is not a ready llama-server."""
    try:
        if client.get(url + "/health", timeout=10).status_code != 200:
            raise BenchError(f"{url} is not ready (/health is not 200): wait for the load to finish")
    except httpx.HTTPError as exc:
        raise BenchError(f"{url} does not answer ({type(exc).__name__}): start a server (pyllm serve) or check --url") from exc


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


# --- tune ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Candidate:
    label: str
    serve_args: list[str]  # pyllm serve options
    extra_args: list[str]  # llama-server flags after --
    tensor_split: str | None = None
    split_mode: str | None = None


def candidates(architecture: str, n_gpus: int) -> list[Candidate]:
    """The flag sets worth measuring on this box (the baseline first: llama.cpp's defaults)."""
    out = [Candidate("defaults", [], [])]
    for ub in (256, 1024):
        out.append(Candidate(f"-ub {ub} -b {max(2048, ub)}", [], ["-ub", str(ub), "-b", str(max(2048, ub))]))
    for fa in ("on", "off"):
        out.append(Candidate(f"-fa {fa}", [], ["-fa", fa]))
    if n_gpus > 1:
        modes = ["layer"] + ([] if architecture == "deepseek4" else ["tensor"])  # row: gone from llama.cpp's CUDA backend
        for mode in modes:
            out.append(Candidate(f"--split-mode {mode} over {n_gpus} GPUs", [], [], tensor_split=f"1x{n_gpus}", split_mode=mode))
        for k in range(1, n_gpus):
            out.append(Candidate(f"{k} GPU(s)", [], [], tensor_split=",".join(["1"] * k + ["0"] * (n_gpus - k))))
    return out


def serve_and_run(model: Any, *, prompt_tokens: int = 512, gen_tokens: int = 128, concurrency: int = 1, repeat: int = 3,
                  ctx_size: int | None = None, tensor_split: str | None = None) -> BenchResult:
    """:func:`run` against a managed server of ``model`` started for it (one slot per client), stopped after."""
    from ..serve.server import Server

    with Server(model, port=0, ctx_size=ctx_size or 4096, tensor_split=tensor_split, parallel=concurrency,
                ready_timeout=3600) as server:
        return run(server.base_url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=concurrency,
                   repeat=repeat)


@dataclasses.dataclass
class TuneRow:
    candidate: Candidate
    result: BenchResult | None
    error: str | None


def tune(model: str, *, prompt_tokens: int = 512, gen_tokens: int = 64, repeat: int = 2, ctx_size: int = 4096,
         on_row: Callable[[TuneRow], None] | None = None) -> list[TuneRow]:
    """Measure every candidate; each starts its own managed server on a free port."""
    from ..models.gguf_files import resolve_model
    from ..devices.gpus import visible_gpus
    from ..serve.server import Server

    files = resolve_model(model)
    rows = []
    for cand in candidates(files.architecture, len(visible_gpus())):
        try:
            with Server(files, port=0, ctx_size=ctx_size, tensor_split=cand.tensor_split, split_mode=cand.split_mode,
                        extra_args=cand.extra_args, ready_timeout=1800) as server:
                row = TuneRow(cand, run(server.base_url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, repeat=repeat), None)
        except PyllmError as exc:
            row = TuneRow(cand, None, str(exc))
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


MIN_GAIN = 0.03  # a candidate must beat the defaults' decode by this much: smaller differences are run-to-run noise


def winner(rows: list[TuneRow]) -> TuneRow:
    """Best decode speed (the number a chat user feels), but the defaults unless beaten by more than noise.

    On the GPU machine a sweep's flag sets landed within -6 %..+1 % of the defaults, except
    -fa off (-17 %); its +0.6 % "winner" then lost to the seed flags when measured again.
    """
    ok = [r for r in rows if r.result is not None]
    if not ok:
        raise BenchError("no candidate ran: " + "; ".join(f"{r.candidate.label}: {r.error}" for r in rows[:3]))
    best = max(ok, key=lambda r: (round(r.result.decode_tps, 1), r.result.prefill_tps))
    base = next((r for r in ok if r.candidate.label == "defaults"), None)
    if base is not None and best.result.decode_tps < base.result.decode_tps * (1 + MIN_GAIN):
        return base
    return best


def serve_command(model: str, cand: Candidate) -> str:
    parts = ["pyllm serve", model]
    if cand.tensor_split:
        parts += ["--tensor-split", cand.tensor_split]
    if cand.split_mode:
        parts += ["--split-mode", cand.split_mode]
    if cand.extra_args:
        parts += ["--", *cand.extra_args]
    return " ".join(parts)
