"""The KV pool and slots serve plans from memory (planning/capacity.py), and the llama-server flags that carry it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllm_a100.planning import capacity, memplan

GIB = 1 << 30


def test_deepseek_v4_flash_on_eight_80gb_gpus_gets_16_slots_of_its_full_context() -> None:
    """Issue 40's criterion: at least 4 slots of at least 131,072 tokens, and it fits (UD mix); V4's caches are per
    sequence, so each slot owns its share and the plan is not a shared pool."""
    (ud,) = [s for s in memplan.preset_shapes("deepseek-v4-flash") if s.label == "ud-q8-k-xl"]
    plan = capacity.plan(ud, capacity.Budget.gpus([80 * GIB] * 8))
    assert plan.fits and plan.slots == 16 and plan.per_slot == 1048576 and not plan.shared
    assert plan.argv() == ["--parallel", "16", "--ctx-size", str(16 * 1048576)]
    assert "16 slots, up to 1,048,576 tokens each (the trained context)" in plan.summary()


def test_glm5_shares_a_pool_filled_to_the_memory_left_and_fewer_gpus_give_less() -> None:
    (ud,) = [s for s in memplan.preset_shapes("glm-5") if s.label == "ud-q8-k-xl"]
    eight = capacity.plan(ud, capacity.Budget.gpus([80 * GIB] * 8))
    assert eight.fits and eight.shared and eight.per_slot == eight.trained == 202752
    assert 4 * 131072 <= eight.pool < 16 * 202752, "the pool is what memory holds, not every slot at full context"
    assert eight.argv() == ["--parallel", "16", "--kv-unified", "--ctx-size", str(eight.pool),
                            "--kv-unified-per-slot", "202752"]
    used = capacity.plan(ud, capacity.Budget.gpus([80 * GIB] * 8, [10 * GIB] * 8))  # other processes hold 10 GiB each
    assert used.pool < eight.pool
    nothing = capacity.plan(ud, capacity.Budget.gpus([80 * GIB] * 4))  # the weights alone do not fit four
    assert not nothing.fits and nothing.largest_pool == 0


def test_a_pool_the_user_asks_for_is_checked_and_the_largest_that_fits_is_named() -> None:
    (ud,) = [s for s in memplan.preset_shapes("glm-5") if s.label == "ud-q8-k-xl"]
    budget = capacity.Budget.gpus([80 * GIB] * 8)
    small = capacity.plan(ud, budget, pool=131072, slots=4)
    assert small.fits and small.pool == 131072 and small.slots == 4 and small.per_slot == 131072
    huge = capacity.plan(ud, budget, pool=50_000_000)
    assert not huge.fits and 0 < huge.largest_pool < 50_000_000
    assert capacity.plan(ud, budget, pool=huge.largest_pool).fits


def test_cpu_budget_is_a_stated_share_of_available_memory(tiny_models: dict[str, Path]) -> None:
    b = capacity.Budget.cpu(40 * GIB)
    assert b.per_device == (4 * GIB,) and not b.gpu and "25%" in b.rule
    assert capacity.Budget.cpu(8 * GIB).per_device == (2 * GIB,)
    assert capacity.Budget.cpu(8 * GIB, whole=True).per_device == (8 * GIB,)


def test_serve_argv_carries_the_plan_and_sizing_after_dashes_is_the_users(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100.serve.resolve import resolve
    from pyllm_a100.serve.options import ServeOptions

    llama = tiny_models["tiny-llama"]
    argv = resolve(ServeOptions(llama, port=0)).to_argv("llama-server")
    assert argv[argv.index("--parallel") + 1] == "16" and "--kv-unified" in argv
    assert argv[argv.index("--kv-unified-per-slot") + 1] == "4096" and argv[argv.index("--queue-timeout") + 1] == "600"
    explicit = resolve(ServeOptions(llama, port=0, parallel=2, ctx_size=2048)).to_argv("llama-server")
    assert explicit[explicit.index("--ctx-size") + 1] == "2048" and explicit.count("--parallel") == 1
    theirs = resolve(ServeOptions(llama, port=0, extra_args=["-c", "1024", "-np", "3"])).to_argv("llama-server")
    assert theirs.count("--ctx-size") == 0 and "--kv-unified" not in theirs and theirs[-4:] == ["-c", "1024", "-np", "3"]
    v4 = resolve(ServeOptions(tiny_models["tiny-deepseek4"], port=0, parallel=4)).to_argv("llama-server")
    assert "--kv-unified" not in v4 and v4[v4.index("--ctx-size") + 1] == str(4 * 4096)


def test_a_pool_that_cannot_fit_the_memory_available_is_refused_naming_the_largest(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100.errors import ServerConfigError
    from pyllm_a100.serve.resolve import resolve
    from pyllm_a100.serve.options import ServeOptions

    with pytest.raises(ServerConfigError) as caught:
        resolve(ServeOptions(tiny_models["tiny-glm-dsa"], port=0, ctx_size=2_000_000_000))
    message = str(caught.value)
    assert message.startswith("--ctx-size 2000000000: ") and "the largest pool that fits" in message and "\n" not in message


def test_a_prefill_lane_is_planned_with_the_pool_and_passed_only_when_on(tiny_models: dict[str, Path]) -> None:
    """--prefill-lane (patch 0049): its cache of one slot's context is planned with the pool and sized in the argv; on
    the CPU it is off unless asked (two contexts would share the cores), and llama.cpp's own scheduling has none."""
    from pyllm_a100.planning import capacity
    from pyllm_a100.planning.memplan import local_shape
    from pyllm_a100.models.gguf_files import resolve_model
    from pyllm_a100.serve.options import LLAMA_CPP_SCHEDULING, ServeOptions
    from pyllm_a100.serve.resolve import resolve

    llama = tiny_models["tiny-llama"]
    default = resolve(ServeOptions(llama, port=0))
    argv = default.to_argv("llama-server")
    assert "--prefill-lane" not in argv and "--prefill-lane-ctx" not in argv and default.capacity.lane == 0
    asked = resolve(ServeOptions(llama, port=0, prefill_lane=1024))
    argv = asked.to_argv("llama-server")
    assert argv[argv.index("--prefill-lane") + 1] == "1024" and asked.capacity.lane == asked.capacity.per_slot
    assert argv[argv.index("--prefill-lane-ctx") + 1] == str(asked.capacity.per_slot)
    assert "prefill lane of" in asked.capacity.summary() and "--prefill-lane" in asked.scheduling
    baseline = resolve(ServeOptions(llama, port=0, **LLAMA_CPP_SCHEDULING)).to_argv("llama-server")
    assert "--prefill-lane" not in baseline and "--decode-latency-target" not in baseline
    # on GPUs: the lane's own cache and compute buffer come out of the same budget, so the pool that fits is smaller
    shape = local_shape(resolve_model(tiny_models["tiny-deepseek4"]))
    budget = capacity.Budget.gpus([2 * GIB])
    without, with_lane = capacity.plan(shape, budget), capacity.plan(shape, budget, lane=True)
    assert with_lane.lane == with_lane.per_slot and with_lane.fits
    assert with_lane.kv_bytes > without.kv_bytes or with_lane.largest_pool < without.largest_pool
