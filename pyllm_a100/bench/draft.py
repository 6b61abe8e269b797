"""`pyllm bench draft`: a draft's acceptance and step cost against no draft, with the same greedy tokens checked.

The same prompts are served plainly, then with the draft's extra llama-server arguments; llama-server's
``timings`` give ``draft_n`` and ``draft_n_accepted``.
"""


from __future__ import annotations

import dataclasses
import logging
import os
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from .client import BenchError, _vocab_size, check_ready, stream_completion

log = logging.getLogger(__name__)

@dataclasses.dataclass
class DraftRun:
    requests: int
    draft_args: list[str]
    plain_decode_tps: float  # median llama-server predicted_per_second without the draft
    draft_decode_tps: float  # the same with the draft
    drafted: int  # sum of draft_n
    accepted: int  # sum of draft_n_accepted
    acceptance: float  # accepted / drafted (0 when nothing was drafted)
    steps: int  # verify steps: generated tokens - accepted - 1 per request (the first token comes from the prompt)
    plain_step_ms: float  # one decode step without the draft
    draft_step_ms: float  # one draft + verify step
    overhead_ms: float  # draft_step_ms - plain_step_ms
    same_tokens: bool  # temperature 0: the same token ids, up to batch-dependent rounding (docs/speculative.md)
    first_difference: list[int | None]  # per request: the first token index where the two runs part (None: equal)

    @property
    def drafted_per_step(self) -> float:
        return self.drafted / self.steps if self.steps else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a step yields: the accepted drafted tokens and the target's own."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _series(url: str, prompts: list[list[int]], gen_tokens: int) -> list[tuple[dict, list[int]]]:
    """(timings, token ids) of one greedy completion per prompt, after an uncounted warm-up."""
    from .draft_exactness import greedy

    with httpx.Client(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        check_ready(client, url)
        stream_completion(client, url, prompts[0][:8], 8)  # warm-up, not counted
    out = []
    for p in prompts:
        try:
            tokens, timings = greedy(url, p, gen_tokens)
        except httpx.HTTPStatusError as exc:
            raise BenchError(f"{url}/completion answered HTTP {exc.response.status_code}: {exc.response.text[:200]}") from exc
        out.append((timings, tokens))
    return out


def draft_run(model: str | os.PathLike[str], draft_args: Sequence[str], *, prompt_tokens: int = 128, gen_tokens: int = 128,
              requests: int = 3, seed: int = 0, log_dir: Path | None = None, **server_options: Any) -> DraftRun:
    """The same prompts on the model served plainly, then with ``draft_args`` added to llama-server's argv."""
    return draft_runs(model, [draft_args], prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, requests=requests,
                      seed=seed, log_dir=log_dir, **server_options)[0]


def draft_runs(model: str | os.PathLike[str], variants: Sequence[Sequence[str]], *, prompt_tokens: int = 128,
               gen_tokens: int = 128, requests: int = 3, seed: int = 0, log_dir: Path | None = None,
               **server_options: Any) -> list[DraftRun]:
    """The same prompts on the model served plainly (once), then once per entry of ``variants`` (llama-server
    arguments added to its argv, e.g. one draft at two lengths): one DraftRun per variant, each against the plain run."""
    from ..serve.server import Server

    if not variants or not all(variants):
        raise BenchError("--spec-args: give the draft's llama-server arguments, e.g. '-md draft.gguf --spec-type draft-simple'")
    extra = list(server_options.pop("extra_args", ()))
    ready_timeout = server_options.pop("ready_timeout", 3600)
    ctx = max(4096, prompt_tokens + gen_tokens + 256)
    results: list[list[tuple[dict, list[int]]]] = []
    prompts: list[list[int]] = []
    for i, args in enumerate([extra] + [extra + list(v) for v in variants]):
        name = "spec-plain.log" if not i else "spec-draft.log" if len(variants) == 1 else f"spec-draft-{i}.log"
        log_path = log_dir / name if log_dir else None
        with Server(model, port=0, ctx_size=ctx, parallel=1, extra_args=args, log_path=log_path,
                    ready_timeout=ready_timeout, **server_options) as srv:
            if not prompts:
                with httpx.Client() as client:
                    n_vocab = _vocab_size(client, srv.base_url)
                rng = random.Random(seed)
                prompts = [[rng.randrange(10, max(11, n_vocab - 1)) for _ in range(prompt_tokens)] for _ in range(requests)]
            results.append(_series(srv.base_url, prompts, gen_tokens))
    plain_runs = results[0]
    plain = [t for t, _ in plain_runs]
    plain_tokens = sum(max(1, int(t.get("predicted_n", 0)) - 1) for t in plain)
    plain_step = sum(float(t.get("predicted_ms", 0.0)) for t in plain) / plain_tokens
    plain_tps = statistics.median(float(t.get("predicted_per_second", 0.0)) for t in plain)
    out = []
    for draft_args, draft_runs_ in zip(variants, results[1:]):
        draft = [t for t, _ in draft_runs_]
        drafted = sum(int(t.get("draft_n", 0)) for t in draft)
        accepted = sum(int(t.get("draft_n_accepted", 0)) for t in draft)
        steps = sum(max(1, int(t.get("predicted_n", 0)) - int(t.get("draft_n_accepted", 0)) - 1) for t in draft)
        draft_step = sum(float(t.get("predicted_ms", 0.0)) for t in draft) / steps
        out.append(DraftRun(
            requests=requests, draft_args=list(draft_args),
            plain_decode_tps=plain_tps,
            draft_decode_tps=statistics.median(float(t.get("predicted_per_second", 0.0)) for t in draft),
            drafted=drafted, accepted=accepted, acceptance=accepted / drafted if drafted else 0.0, steps=steps,
            plain_step_ms=plain_step, draft_step_ms=draft_step, overhead_ms=draft_step - plain_step,
            same_tokens=all(a == b for (_, a), (_, b) in zip(plain_runs, draft_runs_)),
            first_difference=[next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                              for (_, a), (_, b) in zip(plain_runs, draft_runs_)]))
    return out


