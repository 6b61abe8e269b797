"""What a draft will give on this box: measure, then project (`pyllm bench speculate`).

Three measurements of the user's model on the user's GPUs, one after the other:

* the verify cost of k = 1 .. draft_max + 1 tokens per forward (llama-bench, speculative.verify_cost);
* a draft run (llama-server without and with the draft, speculative.draft_run): the step with the draft, the tokens it
  drafted and had accepted, and whether the greedy tokens stayed the same;
* the draft's own cost, from those two: the step with it minus the step without it, minus the extra verify cost of the
  tokens it drafted (speculative.draft_ms_per_step). A DSpark/DFlash draft proposes its block in one pass (a cost per
  step, whatever k); an MTP block or a small model pays per drafted token.

Then, for each acceptance -- this run's own, an accepted length per step (default DSpark's published 2.5 and 2.9 at 7
drafted tokens: vllm#51758, vllm#56797, vllm-ascend#13640), or a per-token rate -- the tokens/s each draft length k
would give, E(a, k) / (T_verify(k + 1) + T_draft(k)), and the best k (or none: plain decoding wins).

The acceptance this run measures comes from its own prompts (random token ids): a real draft on real text accepts far
more, which is why the published lengths are the default.

Beside each verify cost, the weights that forward must read against one token's (speculative.verify_cost's "weights",
from the model's own header): a MoE model's k tokens reach more experts than one (independently routed here; real
routing, correlated between neighbouring tokens, reaches fewer). A measured cost far above it names a kernel that pays
per token what it could pay per expert; one a little under it is normal, since a one-token step also pays launches and
small kernels that do not grow with k (DeepSeek-V4, 256 experts, 8 tokens: 2.18x a step against 2.37x read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .speculative import DraftRun, VerifyCost, draft_ms_per_step, draft_run, expected_tokens, projection, verify_cost
from .throughput import BenchError

ACCEPT_LENS = (2.5, 2.9)  # DSpark's mean accepted tokens per step on real text, 7 drafted
K_REF = 7  # drafted tokens per step at which an accepted length is quoted (DSpark's block of 8)
PER_STEP_TYPES = ("draft-dspark", "draft-dflash")  # the whole block in one pass
DRAFT_MAX = 7


def acceptance_for(accept_len: float, drafted: int = K_REF) -> float:
    """The per-token acceptance a with E(a, drafted) = accept_len (bisection: E grows with a)."""
    if not 1.0 <= accept_len <= drafted + 1:
        raise BenchError(f"accepted length {accept_len:g}: give the mean tokens a step yields with {drafted} drafted, "
                         f"between 1 and {drafted + 1} (DSpark: 2.5-2.9)")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, drafted) < accept_len else (lo, mid)
    return (lo + hi) / 2


def acceptances(accept_lens: Sequence[float], rates: Sequence[float]) -> list[tuple[str, float]]:
    """[(where it comes from, a)] for the given accepted lengths and per-token rates (checked)."""
    out = [(f"accepted length {L:g} at {K_REF} drafted", acceptance_for(L)) for L in accept_lens]
    for a in rates:
        if not 0.0 <= a <= 1.0:
            raise BenchError(f"--acceptance {a:g}: a per-token acceptance is between 0 and 1 (DSpark on real text: ~0.65-0.7)")
        out.append((f"acceptance {a:g} per token", a))
    return out


@dataclasses.dataclass
class Choice:
    source: str  # where the acceptance comes from
    acceptance: float  # per drafted token
    best_k: int  # drafted tokens per step; 0 = plain decoding wins
    tokens_per_step: float
    tokens_per_s: float
    speedup: float  # over plain decoding on the same measurements
    curve: list[dict[str, float]]  # {"k", "tokens_per_s"} for every k measured


@dataclasses.dataclass
class Speculation:
    spec_type: str
    draft_args: list[str]
    per_step: bool  # the draft's cost is per step (DSpark/DFlash), else per drafted token
    draft_ms: float  # its own cost: per step, or per drafted token
    drafted_per_step: float  # in the draft run
    plain_tps: float  # 1000 / the decode step of the verify run
    verify: VerifyCost
    run: DraftRun
    choices: list[Choice]

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def choose(source: str, a: float, cost: VerifyCost, per_step: bool, draft_ms: float, draft_max: int) -> Choice:
    """The best draft length for acceptance a over the measured verify costs (speculative.projection's rows; k = 0:
    plain decoding)."""
    plain = 1000.0 / cost.decode_ms
    rows = projection(cost, acceptances=(a,), draft_ms_per_token=0.0 if per_step else draft_ms,
                      draft_ms_per_step=draft_ms if per_step else 0.0)
    curve = [{"k": 0, "tokens_per_s": plain}]
    curve += [{"k": r["k"], "tokens_per_s": r["expected_tokens"] / r["step_ms"] * 1000.0} for r in rows if r["k"] <= draft_max]
    best = max(curve, key=lambda r: r["tokens_per_s"])
    k = int(best["k"])
    return Choice(source=source, acceptance=a, best_k=k, tokens_per_step=expected_tokens(a, k),
                  tokens_per_s=best["tokens_per_s"], speedup=best["tokens_per_s"] / plain, curve=curve)


def speculate(model: str, draft_spec: str, *, draft_max: int = DRAFT_MAX, accept_lens: Sequence[float] = ACCEPT_LENS,
              rates: Sequence[float] = (), depth: int = 512, prompt_tokens: int = 128, gen_tokens: int = 128,
              requests: int = 3, tensor_split: str | None = None) -> Speculation:
    """Measure the verify costs and a draft run of ``draft_spec`` (a GGUF or ``auto``, as `pyllm serve --draft`) with
    ``model``, then the best draft length per acceptance. Bad input raises BenchError or DraftError before any run."""
    from ..models.drafts import resolve
    from ..models.gguf_files import resolve_model

    if not 1 <= draft_max <= 15:
        raise BenchError(f"--draft-max {draft_max}: draft 1 to 15 tokens a step (the verify forwards measured are k + 1 <= 16)")
    sources = acceptances(accept_lens, rates)  # checked before anything runs
    draft = resolve(resolve_model(model), draft_spec, draft_max)
    per_step = draft.spec_type in PER_STEP_TYPES
    cost = verify_cost(model, list(range(1, draft_max + 2)), depth=depth, tensor_split=tensor_split)
    run = draft_run(model, draft.argv(), prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, requests=requests,
                    tensor_split=tensor_split)
    drafted_per_step = run.drafted / run.steps if run.steps else 0.0
    d = min(draft_max, max(1, round(drafted_per_step)))
    own = draft_ms_per_step(run.overhead_ms, cost, d)
    draft_ms = own if per_step else own / d
    if run.drafted:
        sources.insert(0, ("this run's prompts (random tokens)", run.acceptance))
    choices = [choose(src, a, cost, per_step, draft_ms, draft_max) for src, a in sources]
    return Speculation(spec_type=draft.spec_type, draft_args=draft.argv(), per_step=per_step, draft_ms=draft_ms,
                       drafted_per_step=drafted_per_step, plain_tps=1000.0 / cost.decode_ms, verify=cost, run=run,
                       choices=choices)
