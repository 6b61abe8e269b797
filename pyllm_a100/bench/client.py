"""What every `pyllm bench` command shares: requests of exact lengths streamed to a llama-server.

Requests are token ids with ``ignore_eos`` and no prompt cache, and llama-server's own timings are read
(``prompt_per_second``, ``predicted_per_second``); the time to the first token is measured on the stream.
"""

from __future__ import annotations

import dataclasses
import json
import time

import httpx

from ..errors import PyllmError


class BenchError(PyllmError, RuntimeError):
    """``http://127.0.0.1:8080 does not answer /health: start it (pyllm serve) or check --url``"""


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


