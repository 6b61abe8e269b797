"""`pyllm bench verify`: what a speculative verify step costs, and what speculative decoding can win here.

* verify cost (llama-bench): one forward of k tokens appended to a context of ``depth``
  tokens (``-p k -d depth``: one ``llama_decode`` of k tokens, ubatch 512 >= k) against one
  decode step (``-n N -d depth``: N single-token forwards, time / N);
* a projection: with acceptance a per drafted token and k drafted tokens per step, a step
  yields E = (1 - a^(k+1)) / (1 - a) tokens and costs T_verify(k+1) + T_draft(k), so the
  speedup over plain decoding is E * T_decode / (T_verify(k+1) + T_draft(k)). `pyllm bench draft` (draft.py)
  measures a draft's acceptance and overhead; `pyllm bench speculate` puts both together.
"""


from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from .client import BenchError

log = logging.getLogger(__name__)

MAX_K = 64


def parse_k_range(text: str) -> list[int]:
    """``"1-16"`` -> 1..16; ``"1,2,4,8"`` works too. Every k >= 1, at most 64 (one micro-batch)."""
    text = str(text).strip()
    m = re.fullmatch(r"(\d+)-(\d+)", text)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo < 1 or hi < lo or hi > MAX_K:
            raise BenchError(f"--verify-cost {text}: give FIRST-LAST with 1 <= FIRST <= LAST <= {MAX_K}, e.g. 1-16")
        return list(range(lo, hi + 1))
    parts = [p.strip() for p in text.split(",")]
    if not text or not all(p.isdigit() and 1 <= int(p) <= MAX_K for p in parts) or len(set(parts)) != len(parts):
        raise BenchError(f"--verify-cost {text!r}: give a range FIRST-LAST (e.g. 1-16) or distinct token counts "
                         f"1..{MAX_K} separated by commas (e.g. 1,2,4,8)")
    return [int(p) for p in parts]


# --- verify cost (llama-bench) ------------------------------------------------------------


@dataclasses.dataclass
class VerifyCost:
    depth: int  # tokens already in the context
    decode_ms: float  # one decode step: llama-bench tg (N single-token forwards) / N, median of the repetitions
    # {"k", "ms" (one forward of k tokens), "ratio" (ms / decode_ms), "weights" (the weight bytes that forward must
    # read / one token's with independent routing: planning/roofline.py read_ratio; "ratio" far above it is a kernel
    # paying per token, a little under it the one-token step's fixed costs)}
    rows: list[dict[str, float]]
    argv: list[str]
    repetitions: int

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def ms(self, k: int) -> float | None:
        return next((r["ms"] for r in self.rows if r["k"] == k), None)


def _llama_bench_split(tensor_split: str | None) -> list[str]:
    if tensor_split is None:
        return []
    from ..devices.splits import parse_tensor_split

    parts = parse_tensor_split(tensor_split)
    return ["-sm", "layer", "-ts", "/".join(f"{p:g}" for p in parts)]


def verify_cost(model: str | os.PathLike[str], ks: Sequence[int], *, depth: int = 512, decode_tokens: int = 16,
                repetitions: int = 5, tensor_split: str | None = None, env: dict[str, str] | None = None,
                extra_args: Sequence[str] = (), timeout: float = 1800) -> VerifyCost:
    """One llama-bench run: ``-p k1,k2,... -n decode_tokens -d depth -r repetitions -o json``.

    Keep ``repetitions`` at 5 or more: a k-token forward runs without its CUDA graph on the first repetitions (the
    graph is captured, then replayed), and only a median of 5 is a replay, which is what a server's repeated verify
    runs. With 3, GLM-5's 2-token forward measured 1.55x a step against 1.17x (docs/performance.md)."""
    from ..llamacpp.native import binary
    from ..models.gguf_files import resolve_model
    from ..planning.roofline import weights_per_token

    if not ks or any(k < 1 or k > MAX_K for k in ks):
        raise BenchError(f"--verify-cost: every k must be 1..{MAX_K}")
    if depth < 0:
        raise BenchError(f"--depth {depth}: give the tokens already in the context, 0 or more")
    if decode_tokens < 1 or repetitions < 1:
        raise BenchError(f"verify_cost(decode_tokens={decode_tokens}, repetitions={repetitions}): both must be 1 or more")
    files = resolve_model(model)
    argv = [str(binary("llama-bench")), "-m", str(files.first), "-p", ",".join(map(str, ks)), "-n", str(decode_tokens),
            "-d", str(depth), "-r", str(repetitions), "-ub", str(max(512, max(ks))), "-o", "json",
            *_llama_bench_split(tensor_split), *extra_args]
    log.info("verify cost: %s", " ".join(argv))
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"llama-bench did not finish in {timeout:.0f} s: lower --repeat or the k range") from exc
    if out.returncode != 0:
        tail = " | ".join(out.stderr.strip().splitlines()[-3:])
        raise BenchError(f"llama-bench exited with status {out.returncode}: {tail}")
    tests = json.loads(out.stdout)
    median_ms = {}
    for t in tests:
        key = ("pp", t["n_prompt"]) if t["n_prompt"] else ("tg", t["n_gen"])
        median_ms[key] = statistics.median(t["samples_ns"]) / 1e6
    decode = median_ms[("tg", decode_tokens)] / decode_tokens
    weights = weights_per_token(files)
    rows = [{"k": k, "ms": median_ms[("pp", k)], "ratio": median_ms[("pp", k)] / decode, "weights": weights.read_ratio(k)}
            for k in ks]
    return VerifyCost(depth=depth, decode_ms=decode, rows=rows, argv=argv[1:], repetitions=repetitions)


# --- projection ---------------------------------------------------------------------------

FORMULA = "speedup(a, k) = E * T_decode / (T_verify(k+1) + T_draft(k)), E = (1 - a^(k+1)) / (1 - a)"


def expected_tokens(a: float, k: int) -> float:
    """Tokens one step yields with k drafted tokens, each accepted with probability a (in order)."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def ceiling(a: float, cost_ratio: Mapping[int, float], max_drafted: int) -> tuple[int, float]:
    """The most a draft can give at per-token acceptance ``a`` when drafting is free and the host adds nothing: the best
    over 1..max_drafted drafted tokens d of E(a, d) / cost_ratio[d + 1], as (d, x plain); (0, 1.0) when no length beats
    plain decoding. cost_ratio: {k: a k-token forward's cost / a one-token step's}, either the weights it must read
    (VerifyCost rows' "weights": the bandwidth bound, which no kernel beats) or the measured step ("ratio")."""
    best = (0, 1.0)
    for d in range(1, max_drafted + 1):
        r = cost_ratio.get(d + 1)
        x = expected_tokens(a, d) / r if r else 0.0
        if x > best[1]:
            best = (d, x)
    return best


def projection(cost: VerifyCost, *, acceptances: Sequence[float] = (0.5, 0.7, 0.9), draft_ms_per_token: float = 0.0,
               draft_ms_per_step: float = 0.0, decode_ms: float | None = None) -> list[dict[str, Any]]:
    """Speedup per acceptance a and draft length k, for every k whose k+1 verify forward was measured.

    ``draft_ms_per_token``: a draft that costs per drafted token (a small model: T_draft(k) = k x it);
    ``draft_ms_per_step``: a draft that proposes its whole block in one pass (DSpark/DFlash: T_draft(k) = it,
    whatever k). ``decode_ms``: project onto a deeper model whose decode step was measured apart, keeping
    each k's measured ratio T_verify(k) / T_decode (the verify forwards scale like the decode step).
    """
    t_decode = cost.decode_ms if decode_ms is None else decode_ms
    rows = []
    for a in acceptances:
        for k in sorted(r["k"] - 1 for r in cost.rows if r["k"] >= 2):
            verify = cost.ms(k + 1) * t_decode / cost.decode_ms
            step = verify + k * draft_ms_per_token + draft_ms_per_step
            rows.append({"acceptance": a, "k": k, "expected_tokens": expected_tokens(a, k), "step_ms": step,
                         "speedup": expected_tokens(a, k) * t_decode / step})
    return rows


def draft_ms_per_token(overhead_ms: float, cost: VerifyCost, k: int) -> float:
    """The draft's own cost per drafted token: a draft run's overhead per step (``DraftRun.overhead_ms``) minus
    the extra verify cost (T_verify(k+1) - T_decode from llama-bench), over k drafted tokens; never below 0."""
    return draft_ms_per_step(overhead_ms, cost, k) / k if k >= 1 else 0.0


def draft_ms_per_step(overhead_ms: float, cost: VerifyCost, k: int) -> float:
    """The draft's own cost per step: the overhead per step minus the extra verify cost; never below 0."""
    verify = cost.ms(k + 1)
    if verify is None or k < 1:
        return 0.0
    return max(0.0, overhead_ms - (verify - cost.decode_ms))
