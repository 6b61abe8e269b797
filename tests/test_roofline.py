"""Weight bytes per decoded token, read from a real GGUF header, against the synth plan's own sizes."""

from __future__ import annotations

from pathlib import Path

from pyllm_a100 import synth
from pyllm_a100.models.gguf_files import resolve_model
from pyllm_a100.models.roofline import weights_per_token


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
