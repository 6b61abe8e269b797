"""Speculative decoding checked end to end: the same greedy request to llama-server with and without a draft.

At temperature 0 a draft may only change how fast tokens come, never which: the target
verifies every drafted token. :func:`compare` starts the plain server, then the server
with the draft, asks both the same prompt, and returns both token lists, the draft
counts llama-server reports (``timings.draft_n``, ``draft_n_accepted``) and decode speed.
The tests (CPU) and the GPU check share it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import httpx

from ..serve.server import Server

log = logging.getLogger(__name__)

PROMPT = "The quick brown fox jumps over the lazy dog. Write a function that returns the sum of two numbers."


def greedy(base_url: str, prompt: str | list[int], n_predict: int, api_key: str | None = None,
           timeout: float = 600) -> tuple[list[int], dict[str, Any]]:
    """Token ids and timings of one temperature-0 completion (EOS ignored, so every run has ``n_predict`` tokens)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # a fixed seed: a server measuring with synthetic acceptance (--spec-synth-len) accepts the same drafts every run
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1, "return_tokens": True,
            "ignore_eos": True, "cache_prompt": False, "seed": 42}
    r = httpx.post(f"{base_url}/completion", json=body, headers=headers, timeout=timeout)
    r.raise_for_status()
    data = r.json()
    return list(data["tokens"]), dict(data.get("timings") or {})


def compare(model: str | os.PathLike[str], draft: str | os.PathLike[str], *, prompt: str | list[int] = PROMPT,
            n_predict: int = 32, draft_max: int | None = None, repeats: int = 1, **server_options: Any) -> dict[str, Any]:
    """Greedy tokens and speed of ``model`` alone and with ``draft``, one server at a time.

    ``repeats`` > 1 asks each server that many times and reports the best decode speed
    (the first request on a GPU pays for kernel compilation).
    """
    server_options.setdefault("port", 0)
    runs: dict[str, Any] = {}
    for label, extra in (("plain", {}), ("draft", {"draft": str(draft), "draft_max": draft_max})):
        with Server(model, **extra, **server_options) as srv:
            best: dict[str, Any] = {}
            for _ in range(max(1, repeats)):
                tokens, timings = greedy(srv.base_url, prompt, n_predict, api_key=srv.api_key)
                if not best or timings.get("predicted_per_second", 0) > best["timings"].get("predicted_per_second", 0):
                    best = {"tokens": tokens, "timings": timings}
                if best["tokens"] != tokens:
                    best["unstable"] = True  # the same server answered differently: not a draft question
            if label == "draft":
                best["spec_type"] = srv.config.draft.spec_type
            runs[label] = best
    plain, drafted = runs["plain"]["tokens"], runs["draft"]["tokens"]
    first_diff = next((i for i, (a, b) in enumerate(zip(plain, drafted)) if a != b), None)
    t = runs["draft"]["timings"]
    n, accepted = int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0)
    speed_plain = runs["plain"]["timings"].get("predicted_per_second") or 0.0
    speed_draft = t.get("predicted_per_second") or 0.0
    result = {
        "model": str(model), "draft": str(draft), "spec_type": runs["draft"]["spec_type"], "n_predict": n_predict,
        "draft_max": draft_max, "equal": plain == drafted, "first_difference": first_diff,
        "tokens_plain": plain, "tokens_draft": drafted,
        "draft_n": n, "draft_n_accepted": accepted, "acceptance": accepted / n if n else 0.0,
        "tokens_per_s_plain": speed_plain, "tokens_per_s_draft": speed_draft,
        "speedup": speed_draft / speed_plain if speed_plain else None,
    }
    log.info("%s + %s: equal=%s draft_n=%d accepted=%d", model, draft, result["equal"], n, accepted)
    return result
