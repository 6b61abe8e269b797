"""Weight bytes per decoded token, read from a real GGUF header, against the synth plan's own sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllm_a100 import synth
from pyllm_a100.models.gguf_files import resolve_model
from pyllm_a100.planning import roofline
from pyllm_a100.planning.roofline import weights_per_token


def test_active_bytes_count_the_used_experts_and_one_embedding_row(tmp_path: Path) -> None:
    result = synth.synthesize("tiny-deepseek4", tmp_path / "m.gguf", experts=4, seed=1)
    h = synth.hparams_for("tiny-deepseek4", 4)
    sizes = {t.name: synth.tensor_nbytes(t, synth.ggml_type_for(t, "f16")) for t in synth.plan("tiny-deepseek4", experts=4).tensors}
    experts = sum(v for k, v in sizes.items() if "_exps." in k)
    dense = sum(v for k, v in sizes.items() if "_exps." not in k and k != "token_embd.weight")
    expected = dense + experts * h["n_expert_used"] // h["n_expert"] + sizes["token_embd.weight"] // h["n_vocab"]
    w = weights_per_token(resolve_model(result.first))
    assert (w.experts, w.experts_used) == (4, 2) and w.expert_bytes == experts
    assert w.total_bytes == sum(sizes.values())
    assert abs(w.active_bytes - expected) <= len(sizes)  # integer division per tensor
    assert w.ceiling_tokens_per_second(2e12) == 2e12 / w.active_bytes


def test_fewer_experts_leave_the_bytes_per_token_unchanged(tmp_path: Path) -> None:
    full = weights_per_token(resolve_model(synth.synthesize("tiny-deepseek4", tmp_path / "a.gguf", seed=1).first))
    fewer = weights_per_token(resolve_model(synth.synthesize("tiny-deepseek4", tmp_path / "b.gguf", experts=4, seed=1).first))
    assert fewer.total_bytes < full.total_bytes
    # the same experts are read per token; only the router (n_embd x n_expert per layer) shrinks
    assert abs(fewer.active_bytes - full.active_bytes) / full.active_bytes < 0.01


def test_a_k_token_forward_reads_each_reached_expert_once(tmp_path: Path) -> None:
    w = weights_per_token(resolve_model(synth.synthesize("tiny-deepseek4", tmp_path / "m.gguf", seed=1).first))
    n, u = w.experts, w.experts_used
    per_expert = w.expert_bytes / n
    dense = w.active_bytes - per_expert * u
    assert w.read_ratio(1) == pytest.approx(1.0)
    for k in (2, 4, 8):
        assert w.read_ratio(k) == pytest.approx((dense + per_expert * n * (1 - (1 - u / n) ** k)) / w.active_bytes)
    assert w.read_ratio(2) < w.read_ratio(8) < w.read_ratio(1000) <= (dense + w.expert_bytes) / w.active_bytes + 1e-9
    # DeepSeek-V4's 256 experts, 6 a token: 8 tokens reach ~44 of them (16 experts: nearly all 16)
    assert roofline.distinct_experts(256, 6, 8) == pytest.approx(44.3, abs=0.5) and roofline.distinct_experts(16, 6, 8) > 15.5
    dense_model = weights_per_token(resolve_model(synth.synthesize("tiny-llama", tmp_path / "d.gguf", seed=1).first))
    assert dense_model.experts == 0 and dense_model.read_ratio(8) == pytest.approx(1.0)
