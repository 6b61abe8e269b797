"""How many request slots fit: KV memory per slot at the chosen context against the memory left.

Every slot that holds a conversation of ``ctx_per_slot`` tokens needs that many tokens of KV
cache (and recurrent state), whether the slots split ``--ctx-size`` (llama-server's default
with ``--parallel``) or share one pool (``--kv-unified``, pyllm serve's default): N slots at
C tokens each need N x C tokens of cache. The wanted slot count comes from the concurrency
benchmark (``server.DEFAULT_PARALLEL``); memory can only lower it.
"""

from __future__ import annotations

import dataclasses

AUTO_SLOTS = 4  # llama-server's own choice without --parallel (tools/server/server.cpp: 4 slots, kv_unified)


@dataclasses.dataclass(frozen=True)
class SlotPlan:
    slots: int  # what to pass as --parallel
    ctx_per_slot: int
    ctx_size: int  # --ctx-size for the pool: slots x ctx_per_slot
    kv_bytes: int  # cache for the whole pool
    wanted: int  # the slot count asked for before memory was considered
    limited_by_memory: bool
    fits: bool  # False: not even one slot at this context fits the memory given

    def serve_args(self) -> list[str]:
        return ["--parallel", str(self.slots), "--ctx-size", str(self.ctx_size)]


def kv_bytes_per_token(context_bytes: int, ctx: int) -> float:
    """From llama.cpp's memory estimate of the context (KV cache + state) for ``ctx`` tokens of one sequence."""
    if ctx < 1:
        raise ValueError(f"ctx must be at least 1, not {ctx}")
    return context_bytes / ctx


def suggest(kv_per_token: float, ctx_per_slot: int, free_bytes: int, *, wanted: int | None = None) -> SlotPlan:
    """Slots = min(wanted, free_bytes // (kv_per_token x ctx_per_slot)), at least 1.

    ``free_bytes`` is the memory left for the cache once weights and compute buffers are
    placed; ``wanted`` defaults to ``server.DEFAULT_PARALLEL`` (or llama-server's 4).
    """
    from .server import DEFAULT_PARALLEL

    if ctx_per_slot < 1:
        raise ValueError(f"ctx_per_slot must be at least 1, not {ctx_per_slot}")
    if kv_per_token < 0 or free_bytes < 0:
        raise ValueError("kv_per_token and free_bytes cannot be negative")
    want = wanted or DEFAULT_PARALLEL or AUTO_SLOTS
    per_slot = kv_per_token * ctx_per_slot
    room = int(free_bytes // per_slot) if per_slot > 0 else want
    slots = max(1, min(want, room))
    return SlotPlan(slots=slots, ctx_per_slot=ctx_per_slot, ctx_size=slots * ctx_per_slot,
                    kv_bytes=int(per_slot * slots), wanted=want, limited_by_memory=room < want, fits=room >= 1)
