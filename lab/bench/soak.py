"""A serving soak: every prompt length and several concurrency levels against a managed llama-server.

Single requests that all pass prove little: a GPU kernel can fail only for one micro-batch
size (the pinned llama.cpp aborted on DeepSeek-V4's MXFP4 experts when a batch held 8
tokens), and concurrent users produce batches of every size. The soak sends prompts of
every length in a range, one at a time (prompt cache off, so each is evaluated whole),
then waves of concurrent requests with mixed lengths, streaming and not, and counts what
matters: HTTP errors and server crashes (with the log lines that say why). A crashed
server is started again so the rest of the case still runs.

    from pyllm_a100.soak import soak
    result = soak("model.gguf", parallel=16)     # dict: requests, http_errors, crashes, ...

Prompts are token ids (exact lengths, no tokenizer involved); generation is greedy with
``ignore_eos`` so every request produces exactly ``n_predict`` tokens.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from pyllm_a100.bench.throughput import sse_data
from pyllm_a100.serve.server import Server

log = logging.getLogger(__name__)

LENGTHS = range(1, 65)
CONCURRENCY = (1, 2, 4, 8, 16, 32)
# Lines of a dying llama-server's log that say why (CUDA errors, asserts, the failing function).
_CRASH_LINE = re.compile(r"CUDA error|GGML_ASSERT|GGML_ABORT|in function \S+|error:|Segmentation|Aborted|what\(\)")


def prompt_ids(length: int, salt: int, n_vocab: int) -> list[int]:
    """``length`` token ids, different for each ``salt``, avoiding the low ids that small
    vocabularies reserve for special tokens (BOS/EOS/chat markers)."""
    low = min(260, n_vocab // 4)
    span = n_vocab - low
    return [low + (salt * 7919 + i * 131) % span for i in range(length)]


def _request(base_url: str, prompt: list[int], n_predict: int, stream: bool, timeout: float,
             headers: dict[str, str]) -> dict:
    """One /completion request; returns {ok, status, tokens, error}."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True,
            "cache_prompt": False, "stream": stream}
    try:
        if not stream:
            reply = httpx.post(base_url + "/completion", json=body, timeout=timeout, headers=headers)
            if reply.status_code != 200:
                return {"ok": False, "status": reply.status_code, "error": reply.text[:200]}
            tokens = reply.json().get("tokens_predicted")
        else:
            tokens = None
            with httpx.stream("POST", base_url + "/completion", json=body, timeout=timeout, headers=headers) as reply:
                if reply.status_code != 200:
                    reply.read()
                    return {"ok": False, "status": reply.status_code, "error": reply.text[:200]}
                for data in sse_data(reply):  # not iter_lines: it splits inside JSON at U+2028 and friends
                    chunk = json.loads(data)
                    if chunk.get("stop"):
                        tokens = chunk.get("tokens_predicted")
        if tokens != n_predict:
            return {"ok": False, "status": 200, "error": f"{tokens} tokens instead of {n_predict}"}
        return {"ok": True, "status": 200, "tokens": tokens}
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return {"ok": False, "status": None, "error": f"{type(exc).__name__}: {exc}"[:200]}


class _Case:
    """One model + server options: the running server, and the crashes seen so far."""

    def __init__(self, model: str | os.PathLike[str], options: dict[str, Any], log_path: Path | None,
                 on_event: Callable[[str], None]) -> None:
        self.model, self.options, self.log_path, self.on_event = model, options, log_path, on_event
        self.crashes: list[dict] = []
        self.server: Server | None = None

    def start(self) -> Server:
        self.server = Server(self.model, log_path=self.log_path, on_event=self.on_event, **self.options).start()
        return self.server

    def check(self, phase: str) -> None:
        """After each phase: if llama-server died, record why and start it again."""
        assert self.server is not None
        code = self.server.proc.poll() if self.server.proc else None
        if code is None:
            return
        text = self.server.log_text()
        lines = [ln.strip() for ln in text.splitlines() if _CRASH_LINE.search(ln)]
        crash = {"phase": phase, "exit": code, "reason": self.server.explain(code), "log_lines": lines[:6]}
        self.crashes.append(crash)
        self.on_event(f"llama-server crashed during {phase}: {crash['reason']}")
        self.server.stop()
        self.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def soak(
    model: str | os.PathLike[str],
    *,
    lengths: Iterable[int] = LENGTHS,
    concurrency: Sequence[int] = CONCURRENCY,
    n_predict: int = 4,
    ctx_size: int = 4096,
    log_path: str | os.PathLike[str] | None = None,
    request_timeout: float = 300.0,
    seed: int = 0,
    on_event: Callable[[str], None] = lambda message: log.info("%s", message),
    **server_options: Any,
) -> dict:
    """Run the soak against a fresh managed server of ``model``; returns the counts.

    ``server_options`` go to :class:`~pyllm_a100.server.Server` (``parallel``,
    ``tensor_split``, ``n_gpu_layers``, ``env``...). The result has ``requests``,
    ``http_errors``, ``crashes`` (an int), ``crash_details`` and one entry per phase.
    """
    from pyllm_a100.models.gguf_files import resolve_model

    n_vocab = resolve_model(model).n_vocab or 32000
    options = dict(port=0, ctx_size=ctx_size, ready_timeout=900, **server_options)
    case = _Case(model, options, Path(log_path) if log_path else None, on_event)
    rng = random.Random(seed)
    phases: dict[str, dict] = {}
    failures: list[dict] = []
    started = time.monotonic()
    server = case.start()
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    try:
        # 1. every length alone: each prompt is one batch of exactly that many new tokens
        t0 = time.monotonic()
        results = []
        for length in lengths:
            result = _request(case.server.base_url, prompt_ids(length, length, n_vocab), n_predict, False, request_timeout, headers)
            results.append(result)
            if not result["ok"]:
                failures.append({"phase": "lengths", "length": length, **result})
                case.check(f"length {length}")
        phases["lengths"] = {"requests": len(results), "errors": sum(not r["ok"] for r in results),
                             "seconds": round(time.monotonic() - t0, 2)}
        case.check("lengths")
        # 2. waves of concurrent requests: mixed lengths, every other one streamed
        for n in concurrency:
            jobs = [(prompt_ids(rng.randint(min(lengths, default=1), max(lengths, default=64)), 1000 + n * 100 + i, n_vocab), i % 2 == 1)
                    for i in range(n)]
            t0 = time.monotonic()
            base_url = case.server.base_url
            with ThreadPoolExecutor(max_workers=n) as pool:
                results = list(pool.map(lambda job: _request(base_url, job[0], n_predict, job[1], request_timeout, headers), jobs))
            seconds = time.monotonic() - t0
            errors = [dict(phase=f"concurrency {n}", length=len(job[0]), stream=job[1], **r)
                      for job, r in zip(jobs, results) if not r["ok"]]
            failures.extend(errors)
            phases[f"concurrency {n}"] = {"requests": n, "errors": len(errors), "streamed": sum(s for _, s in jobs),
                                          "seconds": round(seconds, 2),
                                          "tokens_per_second": round(sum(r.get("tokens") or 0 for r in results) / seconds, 1)}
            case.check(f"concurrency {n}")
    finally:
        case.stop()
    requests = sum(p["requests"] for p in phases.values())
    return {
        "model": str(model), "server_options": {k: v for k, v in server_options.items() if k != "env"},
        "parallel": server_options.get("parallel") or "default", "n_predict": n_predict,
        "requests": requests, "http_errors": sum(p["errors"] for p in phases.values()),
        "crashes": len(case.crashes), "crash_details": case.crashes, "failures": failures[:20],
        "phases": phases, "seconds": round(time.monotonic() - started, 1),
    }
