"""The KV pool and request slots a server runs with, planned from memory (``pyllm serve`` and ``pyllm doctor``).

Without ``--ctx-size``, the pool fills what the devices have left after weights, compute buffers and a
headroom, and each slot may hold up to the model's trained context:

- GPUs: every GPU keeps :data:`GPU_HEADROOM` of its memory free (vLLM's ``gpu_memory_utilization`` 0.9), at least
  llama.cpp's 1 GiB ``--fit`` margin (a smaller GPU would see layers moved to the CPU);
  the rest, minus what other processes already use, is the budget for this server's weights, KV cache,
  compute buffers and CUDA overhead (memplan.per_device under the layer split);
- CPU only: the KV cache takes at most :data:`CPU_KV_FRACTION` of the memory available, and at most
  :data:`CPU_KV_MAX` (weights are memory-mapped and not counted).

Two cache kinds. Most architectures share one pool between the slots (llama-server's ``--kv-unified``):
``--ctx-size POOL --kv-unified --kv-unified-per-slot CAP``; a slot grows up to CAP while the pool has
room, and llama-server admits a request only when its prompt + ``max_tokens`` fit beside the others'
(our patch), so no request fails because of another. DeepSeek-V4 keeps its caches per sequence whatever
the mode (llama_kv_cache_dsv4: ``unified_raw = false``, each stream sized ``n_ctx_seq``), so there every slot
owns ``CAP`` tokens: ``--ctx-size SLOTS*CAP`` without ``--kv-unified``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .memplan import CACHE_PAD, FIT_MARGIN_MIB, GIB, Shape, kv_layer_bytes, per_device

AUTO_SLOTS = 4  # llama-server's own choice without --parallel (tools/server/server.cpp: 4 slots, kv_unified)
DEFAULT_SLOTS = 16  # request slots without --parallel (docs/performance.md, "Concurrency": 16 streams, 1.22x llama-server's 4)
GPU_HEADROOM = 0.10  # of each GPU's memory kept free
CPU_KV_FRACTION = 0.25  # without a GPU: of the memory available (MemAvailable) at start
CPU_KV_MAX = 4 * GIB
FALLBACK_TRAINED = 16384  # a GGUF that does not say its trained context
PER_SEQUENCE_CACHES = frozenset({"deepseek4"})  # caches sized per sequence even with --kv-unified


@dataclasses.dataclass(frozen=True)
class Budget:
    """Bytes this server may use on each device, and the rule that gave them (said in the plan)."""

    per_device: tuple[int, ...]
    gpu: bool
    rule: str

    @classmethod
    def gpus(cls, total: Sequence[int], used: Sequence[int] | None = None) -> Budget:
        used = list(used) if used is not None else [0] * len(total)
        # and never less than llama.cpp's --fit margin, which would otherwise move layers off a small GPU
        margin = FIT_MARGIN_MIB * 2**20
        each = tuple(max(0, min(int(t * (1 - GPU_HEADROOM)), t - margin) - u) for t, u in zip(total, used))
        small = any(t * GPU_HEADROOM < margin for t in total)
        return cls(each, True, f"{GPU_HEADROOM:.0%} of each GPU kept free" + (
            f" (at least llama.cpp's {FIT_MARGIN_MIB} MiB --fit margin)" if small else "") + (
            "" if not any(used) else ", less what other processes use"))

    @classmethod
    def cpu(cls, available: int, *, whole: bool = False) -> Budget:
        """The default pool's share of RAM; ``whole``: a pool the user asked for only has to fit what is available."""
        if whole:
            return cls((int(available),), False, f"CPU: the {available / GIB:.1f} GiB of memory available")
        kv = min(int(available * CPU_KV_FRACTION), CPU_KV_MAX)
        return cls((kv,), False, f"CPU: KV cache at most {CPU_KV_FRACTION:.0%} of the {available / GIB:.1f} GiB "
                                 f"available, at most {CPU_KV_MAX / GIB:.0f} GiB")


@dataclasses.dataclass(frozen=True)
class Capacity:
    slots: int
    per_slot: int  # the most tokens one request may hold (prompt + reply)
    pool: int  # KV cache cells: llama-server's --ctx-size
    kv_bytes: int
    shared: bool  # the slots share the pool (--kv-unified); False: each owns per_slot
    fits: bool
    largest_pool: int  # the largest pool that fits this budget at this slot count (0: none)
    trained: int  # the model's trained context
    budget: Budget
    devices: int  # GPUs the plan spreads over (0: CPU)
    lane: int = 0  # the prefill lane's cells (one slot's context; 0: no lane), in kv_bytes too

    @property
    def streams(self) -> tuple[int, int]:
        """(cells per stream, streams): the memory plan's ``ctx, slots`` for the cache llama-server builds."""
        return (self.pool, 1) if self.shared else (self.per_slot, self.slots)

    def argv(self) -> list[str]:
        """llama-server's flags for this plan (the lane's size with it, as planned)."""
        lane = ["--prefill-lane-ctx", str(self.lane)] if self.lane else []
        if not self.shared:
            return ["--parallel", str(self.slots), "--ctx-size", str(self.pool), *lane]
        return ["--parallel", str(self.slots), "--kv-unified", "--ctx-size", str(self.pool),
                "--kv-unified-per-slot", str(self.per_slot), *lane]

    def summary(self) -> str:
        where = f"over {self.devices} GPU{'s' if self.devices != 1 else ''}" if self.devices else "in RAM"
        each = f"{self.per_slot:,} tokens each" + (" (the trained context)" if self.per_slot == self.trained else "")
        pool = (f"pool {self.pool:,} tokens shared" if self.shared else f"{self.pool:,} tokens in all, each slot its own")
        lane = f" and a prefill lane of {self.lane:,}" if self.lane else ""
        return (f"{self.slots} slot{'s' if self.slots != 1 else ''}, up to {each}; {pool}{lane}, "
                f"{self.kv_bytes / GIB:.2f} GiB KV {where} ({self.budget.rule})")

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["budget"] = {"per_device": list(self.budget.per_device), "gpu": self.budget.gpu, "rule": self.budget.rule}
        out["summary"] = self.summary()
        return out


def trained_context(shape: Shape) -> int:
    return int(shape.get("context_length") or 0) or FALLBACK_TRAINED


def _pad(n: int) -> int:
    return (n + CACHE_PAD - 1) // CACHE_PAD * CACHE_PAD


def _streams(shape: Shape, pool: int, slots: int) -> tuple[int, int]:
    # a shared pool is one stream of ``pool`` cells, which the attention sees whole (the compute buffer's masks grow
    # with it); per-sequence caches are ``slots`` streams of pool/slots cells
    return (pool, 1) if shape.arch not in PER_SEQUENCE_CACHES else (max(1, pool // slots), slots)


def _per_slot(shape: Shape, pool: int, slots: int) -> int:
    """The most tokens one request may hold with this pool: the trained context at most in a shared pool, its own
    share of the pool in per-sequence caches."""
    return max(1, min(trained_context(shape), pool) if shape.arch not in PER_SEQUENCE_CACHES else pool // slots)


def _kv_and_fit(shape: Shape, budget: Budget, pool: int, slots: int, split: list[float] | None,
                lane: bool) -> tuple[int, bool]:
    per, streams = _streams(shape, pool, slots)
    lane_cells = _per_slot(shape, pool, slots) if lane else 0  # the lane holds one request's prompt
    kv = sum(kv_layer_bytes(shape, per, streams)) + (sum(kv_layer_bytes(shape, lane_cells, 1)) if lane else 0)
    if not budget.gpu:
        return kv, kv <= budget.per_device[0]
    devices = per_device(shape, len(budget.per_device), per, streams, split=split, lane=lane_cells)
    return kv, all(d.total <= b for d, b in zip(devices, budget.per_device))


def plan(shape: Shape, budget: Budget, *, slots: int | None = None, pool: int | None = None,
         split: list[float] | None = None, lane: bool = False) -> Capacity:
    """The pool and slots for ``shape`` within ``budget``; ``slots``/``pool`` given by the user win (and may not fit).
    ``lane``: a prefill lane runs beside the slots (llama-server --prefill-lane): its own KV cache of one slot's
    context and its own compute buffer come out of the same budget."""
    n = slots or DEFAULT_SLOTS
    trained = trained_context(shape)
    shared = shape.arch not in PER_SEQUENCE_CACHES
    step = CACHE_PAD * (1 if shared else n)  # a per-sequence pool grows a padded cell per slot at a time

    def fits(p: int) -> bool:
        return _kv_and_fit(shape, budget, p, n, split, lane)[1]

    # the largest pool that fits, up to every slot holding the trained context: memory is monotone in the pool
    top = n * _pad(trained)
    lo, hi = 0, top // step
    if fits(top):
        lo = hi
    else:
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid * step):
                lo = mid
            else:
                hi = mid - 1
    largest = lo * step
    chosen = pool if pool is not None else largest
    if not shared:
        chosen = max(step, chosen // step * step) if chosen else step
    kv, ok = _kv_and_fit(shape, budget, max(chosen, n), n, split, lane)
    per_slot = _per_slot(shape, chosen, n)
    return Capacity(slots=n, per_slot=per_slot, pool=chosen, kv_bytes=kv, shared=shared, fits=ok and chosen > 0,
                    largest_pool=largest, trained=trained, budget=budget,
                    devices=len(budget.per_device) if budget.gpu else 0, lane=per_slot if lane else 0)


def plan_default_lane(shape: Shape, budget: Budget, threshold: int, **kwargs: Any) -> Capacity:
    """plan() with the prefill lane a server turns on by itself, for prompts of ``threshold``+ new tokens (0: none),
    left out where a slot would hold fewer tokens than that: the lane could never take a prompt there."""
    planned = plan(shape, budget, lane=threshold > 0, **kwargs)
    if threshold > 0 and planned.per_slot < threshold:
        return plan(shape, budget, **kwargs)
    return planned
