"""What a draft will give on this box: measure, then project (`pyllm bench speculate`).

Three measurements of the user's model on the user's GPUs, one after the other:

* the verify cost of k = 1 .. draft_max + 1 tokens per forward (llama-bench, verify.verify_cost);
* draft runs (llama-server without the draft, then with it at two lengths: --draft-max and about half of it,
  draft.draft_runs): the step with the draft, the tokens it drafted and had accepted, and whether the greedy
  tokens stayed the same;
* the draft's own cost, from those: the step with it minus the step without it, minus the extra verify cost of the
  tokens it drafted (verify.draft_ms_per_step), at both lengths; a line through the two gives a cost per step
  and a cost per drafted token (draft_cost). An MTP block or a small model drafts token by token; a DSpark/DFlash draft
  proposes its block in one pass but still pays per position (on an H200 running the sm_80 code, DSpark's cost on the
  4-layer DeepSeek-V4 grew ~0.5 ms per drafted token, from 2.5 ms at 3 to 4.4 ms at 7: its Markov chain and sampling
  run once per position), so neither "per step" nor "per token" alone prices every length.

Then, for each acceptance -- this run's own, an accepted length per step (default DSpark's published 2.5 and 2.9 at 7
drafted tokens: vllm#51758, vllm#56797, vllm-ascend#13640), or a per-token rate -- the tokens/s each draft length k
would give, E(a, k) / (T_verify(k + 1) + T_draft(k)), and the best k (or none: plain decoding wins).

Then each given acceptance's best draft length is served once more with that acceptance made synthetic, beside a
plain run of the same prompts (measure_choices): llama-server's benchmarking mode (--spec-synth-len E(a, k)) accepts
each drafted token with probability a, whatever the target says, so the step pays everything a real acceptance costs
(the longer verify's sampling, the accepted rows the draft takes in, the server's host work) and the tokens/s it gives
are measured, not projected. On an H200 running the sm_80 code the 43-layer DeepSeek-V4 with its DSpark draft at 2.5
measured 1.22-1.29x plain where the projection said up to 1.55x (docs/speculative.md).

The acceptance this run measures comes from its own prompts (random token ids): a real draft on real text accepts far
more, which is why the published lengths are the default.

Beside each verify cost, the weights that forward must read against one token's (verify.verify_cost's "weights",
from the model's own header): a MoE model's k tokens reach more experts than one (independently routed here; real
routing, correlated between neighbouring tokens, reaches fewer). A measured cost far above it names a kernel that pays
per token what it could pay per expert; one a little under it is normal, since a one-token step also pays launches and
small kernels that do not grow with k (DeepSeek-V4, 256 experts, 8 tokens: 2.18x a step against 2.37x read). From
those weights, each acceptance's ceiling (verify.ceiling): the most any draft length could give if every verify
cost only its weights and drafting were free (DeepSeek-V4, 256 experts, 2.5 tokens a step: 1.40x at 2 drafted).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ServerError
from .client import BenchError
from .draft import DraftRun, draft_runs
from .verify import VerifyCost, ceiling, draft_ms_per_step, expected_tokens, projection, verify_cost

if TYPE_CHECKING:
    from ..models.drafts import Draft

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
    # the best k served at this acceptance (llama-server's synthetic acceptance, --spec-synth-len): {"k", "synth_len",
    # "tokens_per_s", "plain_tokens_per_s", "speedup", "tokens_per_step"}, or {"error"} when the run failed; None when
    # not measured
    measured: dict[str, Any] | None = None
    # the most any draft length up to --draft-max could give at this acceptance if each verify forward cost only the
    # weights it must read and drafting were free (verify.ceiling): drafted tokens and x plain
    bound_k: int = 0
    bound_speedup: float = 1.0


@dataclasses.dataclass
class DraftCost:
    """The draft's own cost of drafting k tokens: fixed_ms + k x per_token_ms (each >= 0)."""
    fixed_ms: float  # per step, whatever k (launches, the inject pass, host work)
    per_token_ms: float  # per drafted token (a position's forward, its sampling)
    measured: list[dict[str, float]]  # [{"drafted", "own_ms"}] the runs it comes from

    def ms(self, k: int) -> float:
        return self.fixed_ms + k * self.per_token_ms


def draft_cost(points: Sequence[tuple[float, float]], per_step: bool) -> DraftCost:
    """(drafted per step, own ms) at one or two draft lengths -> a cost per step and per drafted token. Two lengths
    that drafted differently: the line through them (a longer draft measured cheaper is noise: their mean, all of it
    per step). One length (or two that drafted alike): all per step for a block draft (DSpark/DFlash), all per token
    otherwise."""
    pts = sorted(points)
    measured = [{"drafted": d, "own_ms": ms} for d, ms in pts]
    (d_lo, ms_lo), (d_hi, ms_hi) = pts[0], pts[-1]
    if d_hi - d_lo >= 0.5:
        if ms_hi < ms_lo:
            return DraftCost(fixed_ms=(ms_lo + ms_hi) / 2, per_token_ms=0.0, measured=measured)
        slope = (ms_hi - ms_lo) / (d_hi - d_lo)
        return DraftCost(fixed_ms=max(0.0, ms_hi - slope * d_hi), per_token_ms=slope, measured=measured)
    own = sum(ms for _, ms in pts) / len(pts)  # two lengths that drafted alike (a block shorter than both): one length
    if per_step:
        return DraftCost(fixed_ms=own, per_token_ms=0.0, measured=measured)
    return DraftCost(fixed_ms=0.0, per_token_ms=own / max(d_hi, 1.0), measured=measured)


@dataclasses.dataclass
class Speculation:
    spec_type: str
    draft_args: list[str]
    draft: DraftCost  # its own cost per step and per drafted token
    drafted_per_step: float  # in the run at --draft-max
    plain_tps: float  # 1000 / the decode step of the verify run
    verify: VerifyCost
    run: DraftRun  # at --draft-max
    runs: list[DraftRun]  # every draft length measured (the shorter first)
    choices: list[Choice]

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def choose(source: str, a: float, cost: VerifyCost, draft: DraftCost, draft_max: int) -> Choice:
    """The best draft length for acceptance a over the measured verify costs (verify.projection's rows; k = 0:
    plain decoding)."""
    plain = 1000.0 / cost.decode_ms
    rows = projection(cost, acceptances=(a,), draft_ms_per_token=draft.per_token_ms, draft_ms_per_step=draft.fixed_ms)
    curve = [{"k": 0, "tokens_per_s": plain}]
    curve += [{"k": r["k"], "tokens_per_s": r["expected_tokens"] / r["step_ms"] * 1000.0} for r in rows if r["k"] <= draft_max]
    best = max(curve, key=lambda r: r["tokens_per_s"])
    k = int(best["k"])
    bound_k, bound = ceiling(a, {int(r["k"]): r["weights"] for r in cost.rows if r.get("weights")}, draft_max)
    return Choice(source=source, acceptance=a, best_k=k, tokens_per_step=expected_tokens(a, k),
                  tokens_per_s=best["tokens_per_s"], speedup=best["tokens_per_s"] / plain, curve=curve,
                  bound_k=bound_k, bound_speedup=bound)


def draft_lengths(draft_max: int) -> list[int]:
    """The draft lengths a speculate run serves: about half of --draft-max and --draft-max (1: only 1)."""
    return sorted({max(1, (draft_max + 1) // 2), draft_max})


def synthetic_len(a: float, k: int) -> float:
    """The mean accepted length, target token included, of k drafted tokens each accepted with probability a."""
    return float(f"{min(expected_tokens(a, k), k + 1.0):.6f}")  # as llama-server reads it back


def synthetic_args(a: float, k: int) -> list[str]:
    """llama-server arguments that accept each of k drafted tokens with probability a, in order, whatever the target
    says (its benchmarking mode: the mean accepted length E(a, k), target token included, the same model as
    expected_tokens). The tokens such a server returns are not the model's output."""
    return ["--spec-synth-len", f"{synthetic_len(a, k):.6f}"]


def _first_error(message: str) -> str:
    """A failed server's reason: its first error-level log line (ServerError quotes the log's tail, lines joined by
    ' | '), else the message's first line."""
    errors = [seg.split(" E ", 1)[1].strip() for seg in message.split(" | ") if " E " in seg]
    return (errors[0] if errors else message.splitlines()[0] if message else "unknown")[:300]


def measure_choices(model: str, draft: Draft, choices: Sequence[Choice], *, prompt_tokens: int, gen_tokens: int,
                    requests: int, tensor_split: str | None) -> None:
    """Serve the draft at each choice's best k with its acceptance made synthetic, beside a plain run of the same
    prompts, and record the tokens/s measured on each choice (Choice.measured)."""
    todo = [c for c in choices if c.best_k > 0]
    if not todo:
        return
    variants = [dataclasses.replace(draft, n_max=c.best_k).argv() + synthetic_args(c.acceptance, c.best_k) for c in todo]
    try:
        runs = draft_runs(model, variants, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, requests=requests,
                          tensor_split=tensor_split)
    except (ServerError, BenchError) as exc:  # the projection stands; say why it was not checked
        for c in todo:
            c.measured = {"error": _first_error(str(exc))}
        return
    for c, r in zip(todo, runs):
        c.measured = {"k": c.best_k, "synth_len": synthetic_len(c.acceptance, c.best_k),
                      "tokens_per_s": r.draft_decode_tps, "plain_tokens_per_s": r.plain_decode_tps,
                      "speedup": r.draft_decode_tps / r.plain_decode_tps if r.plain_decode_tps else 0.0,
                      "tokens_per_step": r.tokens_per_step}


def speculate(model: str, draft_spec: str, *, draft_max: int = DRAFT_MAX, accept_lens: Sequence[float] = ACCEPT_LENS,
              rates: Sequence[float] = (), depth: int = 512, prompt_tokens: int = 128, gen_tokens: int = 128,
              requests: int = 3, tensor_split: str | None = None, measure: bool = True) -> Speculation:
    """Measure the verify costs and draft runs of ``draft_spec`` (a GGUF or ``auto``, as `pyllm serve --draft`) with
    ``model`` at two draft lengths, then the best draft length per acceptance; ``measure``: then serve each given
    acceptance's best length with that acceptance made synthetic (measure_choices). Bad input raises BenchError or
    DraftError before any run."""
    from ..models.drafts import resolve
    from ..models.gguf_files import resolve_model

    if not 1 <= draft_max <= 15:
        raise BenchError(f"--draft-max {draft_max}: draft 1 to 15 tokens a step (the verify forwards measured are k + 1 <= 16)")
    sources = acceptances(accept_lens, rates)  # checked before anything runs
    lengths = draft_lengths(draft_max)
    draft = resolve(resolve_model(model), draft_spec, draft_max)
    if draft.longest is not None and draft_max > draft.longest:
        raise BenchError(f"--draft-max {draft_max}: this {draft.spec_type} draft proposes at most {draft.longest} tokens a "
                         f"step (its trained block): give --draft-max {draft.longest} or less")
    drafts = [dataclasses.replace(draft, n_max=n) for n in lengths]
    cost = verify_cost(model, list(range(1, draft_max + 2)), depth=depth, tensor_split=tensor_split)
    runs = draft_runs(model, [d.argv() for d in drafts], prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                      requests=requests, tensor_split=tensor_split)
    points = []
    for n, r in zip(lengths, runs):
        drafted = r.drafted_per_step
        d = min(n, max(1, round(drafted)))
        points.append((drafted, draft_ms_per_step(r.overhead_ms, cost, d)))
    own = draft_cost(points, per_step=draft.spec_type in PER_STEP_TYPES)
    run = runs[-1]
    if run.drafted:
        sources.insert(0, ("this run's prompts (random tokens)", run.acceptance))
    choices = [choose(src, a, cost, own, draft_max) for src, a in sources]
    if measure:  # the given acceptances (this run's own was measured as it is)
        given = choices[1:] if run.drafted else choices
        measure_choices(model, draft, given, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, requests=requests,
                        tensor_split=tensor_split)
    return Speculation(spec_type=draft.spec_type, draft_args=draft.argv(), draft=own,
                       drafted_per_step=points[-1][0], plain_tps=1000.0 / cost.decode_ms, verify=cost, run=run,
                       runs=runs, choices=choices)
