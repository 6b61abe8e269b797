"""The KV pool and slots a request gets (planning/capacity.py): planned from the memory its devices have, unless the
caller sized them (``kv_unified``: Server and the benchmarks) or the user's flags after ``--`` did."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..errors import ServerConfigError
from ..models.gguf_files import ModelFiles
from ..planning import capacity
from ..planning.capacity import Budget, Capacity
from ..planning.memplan import local_shape
from .llama_flags import ALL_LAYERS, UserFlags
from .options import DEFAULT_PREFILL_LANE, ServeOptions
from .placement import Placement
from .validate import Parsed

log = logging.getLogger(__name__)
MIB = 2**20


def plan(files: ModelFiles, options: ServeOptions, parsed: Parsed, placement: Placement,
         n_gpu_layers: int | None, *, draft: bool) -> Capacity | None:
    """The planned pool and slots, or None where nobody plans them (sized by the caller or the user's flags, layers
    partly on the CPU beside RPC workers, or not even the default plan fits). With a prefill lane the plan holds its
    cache too; the lane that is on by default (GPUs) is left out where it could never take a prompt (a slot smaller
    than its threshold), beside a draft or under --split-mode tensor (llama-server keeps it off there)."""
    if options.kv_unified is not None or parsed.sized_by_user:
        return None
    split = list(parsed.tensor_split) if parsed.tensor_split is not None else None
    shape = local_shape(files)
    if not parsed.rpc:
        all_local = n_gpu_layers is not None and n_gpu_layers >= shape.n_layer + 1
        budget = _local_budget(options, placement.local, all_local)
    elif n_gpu_layers is not None and n_gpu_layers >= ALL_LAYERS:  # every device reports its own memory: local GPUs and workers' alike
        devices = placement.devices
        budget = Budget.gpus([d.total_mib * MIB for d in devices], [(d.total_mib - d.free_mib) * MIB for d in devices])
    else:
        return None
    asked = explicit_lane(options, parsed.flags)
    if asked is not None:
        return _fit(shape, options, budget, split, asked, as_asked=True)
    by_default = on_gpus(placement.devices, n_gpu_layers) and not draft and parsed.flags.value("split_mode") != "tensor"
    return _fit(shape, options, budget, split, DEFAULT_PREFILL_LANE if by_default else 0, as_asked=False)


def _local_budget(options: ServeOptions, gpus: Sequence[Any], all_layers: bool) -> Budget:
    """This machine's memory for the KV pool: the GPUs' when every layer is offloaded to them, else RAM."""
    if gpus and all_layers:
        return Budget.gpus([g.memory_total for g in gpus], [g.memory_total - g.memory_free for g in gpus])
    import psutil

    # the default pool takes a share of RAM; a pool the user asks for only has to fit what is available
    return Budget.cpu(psutil.virtual_memory().available, whole=options.ctx_size is not None)


def on_gpus(devices: Sequence[Any], n_gpu_layers: int | None) -> bool:
    """Whether this machine's GPUs hold the layers (where a prefill lane runs beside the decoding context)."""
    return bool(n_gpu_layers) and any(d.gpu is not None for d in devices)


def explicit_lane(options: ServeOptions, flags: UserFlags) -> int | None:
    """The prefill lane's threshold someone asked for: the user's --prefill-lane after --, else serve's option; None
    when nobody did (the default decides)."""
    theirs = flags.value("prefill_lane")
    if theirs is not None:
        return int(theirs) if theirs.isdigit() else 0
    return options.prefill_lane


def _fit(shape: Any, options: ServeOptions, budget: Budget, split: list[float] | None, lane: int, *,
         as_asked: bool) -> Capacity | None:
    """The KV pool and slots within ``budget``, beside a prefill lane for prompts of ``lane``+ tokens (0: none): one
    asked for is planned as asked (even where a slot is smaller: llama-server would size its cache otherwise), the
    default one only where a slot can hold such a prompt. A --ctx-size or --parallel that cannot fit is refused,
    naming the largest pool that does; when not even the default plan fits (the weights alone), None: llama.cpp's
    --fit decides."""
    ctx_size, parallel = options.ctx_size, options.parallel
    sized = {"slots": parallel, "pool": ctx_size, "split": split}
    planned = (capacity.plan(shape, budget, lane=lane > 0, **sized) if as_asked
               else capacity.plan_default_lane(shape, budget, lane, **sized))
    if planned.fits:
        log.info("capacity plan: %s", planned.summary())
        return planned
    if ctx_size is None and parallel is None:
        log.warning("no KV pool fits beside the weights (%s): llama.cpp's --fit decides", budget.rule)
        return None
    asked = f"--ctx-size {ctx_size}" if ctx_size is not None else f"--parallel {parallel}"
    if planned.largest_pool:
        unit = "tokens in all" if not planned.shared else "tokens"
        raise ServerConfigError(f"{asked}: {planned.kv_bytes / 2**30:.2f} GiB of KV cache for {planned.pool} tokens does "
                                f"not fit beside the weights and compute buffers ({budget.rule}): the largest pool that "
                                f"fits {planned.slots} slots is --ctx-size {planned.largest_pool} ({unit})")
    raise ServerConfigError(f"{asked}: no KV pool for {planned.slots} slot(s) fits beside the weights and compute buffers "
                            f"({budget.rule}): use fewer --parallel, more GPUs (--tensor-split) or a smaller quantization")
