"""The tensor layouts of the transformer architectures (llama, DeepSeek-V4, GLM-5/DSA, DeepSeek-V3.2),
as the pinned llama.cpp's loaders read them."""

from __future__ import annotations

import math
from collections.abc import Callable


from .plan import BIAS, EMBEDDING, HC_SCALE, Init, POSITION_BIAS, Plan, SINKS, hc_base, reader, writer


def _plan_llama(h: dict, n_layers: int) -> Plan:
    p = Plan("llama", n_layers, [], [])
    n_embd, n_head, n_head_kv, n_ff = h["n_embd"], h["n_head"], h["n_head_kv"], h["n_ff"]
    head, depth = n_embd // n_head, h["n_layers"]
    p.add("context_length", h["n_ctx"], "u32")
    p.add("embedding_length", n_embd, "u32")
    p.add("block_count", n_layers, "u32")
    p.add("feed_forward_length", n_ff, "u32")
    p.add("attention.head_count", n_head, "u32")
    p.add("attention.head_count_kv", n_head_kv, "u32")
    p.add("attention.layer_norm_rms_epsilon", 1e-5, "f32")
    p.add("rope.dimension_count", head, "u32")
    p.add("rope.freq_base", 10000.0, "f32")
    p.tensor("token_embd.weight", (n_embd, h["n_vocab"]), init=EMBEDDING)
    for i in range(n_layers):
        b = f"blk.{i}"
        p.tensor(f"{b}.attn_norm.weight", (n_embd,), "norm")
        p.tensor(f"{b}.attn_q.weight", (n_embd, n_embd))
        p.tensor(f"{b}.attn_k.weight", (n_embd, head * n_head_kv))
        p.tensor(f"{b}.attn_v.weight", (n_embd, head * n_head_kv))
        p.tensor(f"{b}.attn_output.weight", (n_embd, n_embd), init=writer(n_embd, depth))
        p.tensor(f"{b}.ffn_norm.weight", (n_embd,), "norm")
        p.tensor(f"{b}.ffn_gate.weight", (n_embd, n_ff))
        p.tensor(f"{b}.ffn_down.weight", (n_ff, n_embd), init=writer(n_ff, depth))
        p.tensor(f"{b}.ffn_up.weight", (n_embd, n_ff))
    p.tensor("output_norm.weight", (n_embd,), "norm")
    p.tensor("output.weight", (n_embd, h["n_vocab"]))
    return p


def deepseek4_compress_ratios(n_layers: int) -> list[int]:
    """[0, 0] then alternating 4 / 128, as DeepSeek-V4-Flash's config."""
    return [0 if i < 2 else (4 if i % 2 == 0 else 128) for i in range(n_layers)]


def _plan_deepseek4(h: dict, n_layers: int, arch: str = "deepseek4") -> Plan:
    """As llama_model_deepseek4::load_arch_tensors and DeepseekV4Model.set_gguf_parameters.

    ``arch`` names the keys' prefix: ``dflash`` for a DSpark draft's stages (synth/drafts.py).
    """
    p = Plan(arch, n_layers, [], [])
    n_embd, n_head, head, n_vocab = h["n_embd"], h["n_head"], h["head_dim"], h["n_vocab"]
    q_lora, o_lora, o_groups = h["q_lora"], h["o_lora"], h["o_groups"]
    n_expert, n_used, n_shared, n_ff_exp = h["n_expert"], h["n_expert_used"], h["n_expert_shared"], h["n_ff_exp"]
    hc, idx_heads, idx_dim = h["hc_mult"], h["indexer_heads"], h["indexer_dim"]
    ratios = h.get("compress_ratios") or deepseek4_compress_ratios(n_layers)
    ratios = list(ratios)[:n_layers]
    hash_layers = min(h["hash_layers"], n_layers)
    hc_dim, hc_mix = hc * n_embd, (2 + hc) * hc
    depth = h["n_layers"]
    routed_down = writer(n_ff_exp, depth, math.sqrt(n_used) / h["expert_weights_scale"])

    p.add("context_length", h["n_ctx"], "u32")
    p.add("embedding_length", n_embd, "u32")
    if arch == "deepseek4":  # as the converter: a DSpark draft's output is one stream wide
        p.add("embedding_length_out", n_embd * hc, "u32")
    p.add("block_count", n_layers, "u32")
    p.add("attention.head_count", n_head, "u32")
    p.add("attention.head_count_kv", 1, "u32")
    p.add("attention.key_length", head, "u32")
    p.add("attention.value_length", head, "u32")
    p.add("rope.dimension_count", h["rope_dims"], "u32")
    p.add("rope.freq_base", h["rope_freq_base"], "f32")
    p.add("attention.layer_norm_rms_epsilon", h["rms_eps"], "f32")
    p.add("attention.q_lora_rank", q_lora, "u32")
    p.add("attention.sliding_window", h["sliding_window"], "u32")
    p.add("expert_count", n_expert, "u32")
    p.add("expert_used_count", n_used, "u32")
    p.add("expert_shared_count", n_shared, "u32")
    p.add("expert_feed_forward_length", n_ff_exp, "u32")
    p.add("expert_weights_scale", h["expert_weights_scale"], "f32")
    p.add("expert_weights_norm", True, "bool")
    p.add("expert_gating_func", 4, "u32")  # sqrtsoftplus: the only scoring the loader accepts
    p.add("swiglu_clamp_exp", [h["swiglu_clamp"]] * n_layers, "f32[]")
    p.add("swiglu_clamp_shexp", [h["swiglu_clamp"]] * n_layers, "f32[]")
    p.add("attention.indexer.head_count", idx_heads, "u32")
    p.add("attention.indexer.key_length", idx_dim, "u32")
    p.add("attention.indexer.top_k", h["indexer_top_k"], "u32")
    p.add("attention.output_group_count", o_groups, "u32")
    p.add("attention.output_lora_rank", o_lora, "u32")
    p.add("attention.compress_ratios", ratios, "u32[]")
    p.add("attention.compress_rope_freq_base", h["compress_rope_freq_base"], "f32")
    p.add("hyper_connection.count", hc, "u32")
    p.add("hyper_connection.sinkhorn_iterations", h["hc_sinkhorn_iters"], "u32")
    p.add("hyper_connection.epsilon", h["hc_eps"], "f32")
    p.add("hash_layer_count", hash_layers, "u32")

    p.tensor("token_embd.weight", (n_embd, n_vocab), init=EMBEDDING)
    for i in range(n_layers):
        b = f"blk.{i}"
        p.tensor(f"{b}.attn_norm.weight", (n_embd,), "norm")
        p.tensor(f"{b}.attn_sinks.weight", (n_head,), "f32", SINKS)
        p.tensor(f"{b}.attn_q_a.weight", (n_embd, q_lora))
        p.tensor(f"{b}.attn_q_a_norm.weight", (q_lora,), "norm")
        p.tensor(f"{b}.attn_q_b.weight", (q_lora, n_head * head))
        p.tensor(f"{b}.attn_kv.weight", (n_embd, head))
        p.tensor(f"{b}.attn_kv_a_norm.weight", (head,), "norm")
        p.tensor(f"{b}.attn_output_a.weight", (n_head * head // o_groups, o_lora * o_groups))
        p.tensor(f"{b}.attn_output_b.weight", (o_groups * o_lora, n_embd), init=writer(o_groups * o_lora, depth))
        for part in ("attn", "ffn"):
            p.tensor(f"{b}.hc_{part}_fn.weight", (hc_dim, hc_mix), "f32", reader(hc_dim))
            p.tensor(f"{b}.hc_{part}_base.weight", (hc_mix,), "f32", hc_base(hc))
            p.tensor(f"{b}.hc_{part}_scale.weight", (3,), "f32", HC_SCALE)
        ratio = ratios[i]
        if ratio:
            coff = 2 if ratio == 4 else 1
            p.tensor(f"{b}.attn_compressor_kv.weight", (n_embd, coff * head))
            p.tensor(f"{b}.attn_compressor_gate.weight", (n_embd, coff * head))
            p.tensor(f"{b}.attn_compressor_ape.weight", (coff * head, ratio), "f32", POSITION_BIAS)
            p.tensor(f"{b}.attn_compressor_norm.weight", (head,), "norm")
            if ratio == 4:
                p.tensor(f"{b}.indexer.proj.weight", (n_embd, idx_heads))
                p.tensor(f"{b}.indexer.attn_q_b.weight", (q_lora, idx_heads * idx_dim))
                p.tensor(f"{b}.indexer_compressor_kv.weight", (n_embd, 2 * idx_dim))
                p.tensor(f"{b}.indexer_compressor_gate.weight", (n_embd, 2 * idx_dim))
                p.tensor(f"{b}.indexer_compressor_ape.weight", (2 * idx_dim, ratio), "f32", POSITION_BIAS)
                p.tensor(f"{b}.indexer_compressor_norm.weight", (idx_dim,), "norm")
        p.tensor(f"{b}.ffn_gate_inp.weight", (n_embd, n_expert))
        if i < hash_layers:
            p.tensor(f"{b}.ffn_gate_tid2eid.weight", (n_used, n_vocab), "index", Init(high=n_expert))
        else:
            p.tensor(f"{b}.exp_probs_b.bias", (n_expert,), "f32", BIAS)
        p.tensor(f"{b}.ffn_norm.weight", (n_embd,), "norm")
        p.tensor(f"{b}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), "expert")
        p.tensor(f"{b}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), "expert", routed_down)
        p.tensor(f"{b}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), "expert")
        p.tensor(f"{b}.ffn_gate_shexp.weight", (n_embd, n_ff_exp * n_shared))
        p.tensor(f"{b}.ffn_down_shexp.weight", (n_ff_exp * n_shared, n_embd), init=writer(n_ff_exp * n_shared, depth))
        p.tensor(f"{b}.ffn_up_shexp.weight", (n_embd, n_ff_exp * n_shared))
    p.tensor("output_hc_fn.weight", (hc_dim, hc), "f32", reader(hc_dim))
    p.tensor("output_hc_base.weight", (hc,), "f32", hc_base(hc, comb=False))
    p.tensor("output_hc_scale.weight", (1,), "f32", HC_SCALE)
    p.tensor("output_norm.weight", (n_embd,), "norm")
    p.tensor("output.weight", (n_embd, n_vocab))
    return p


def _plan_glm_dsa(h: dict, n_layers: int, arch: str = "glm-dsa") -> Plan:
    """As llama_model_glm_dsa::load_arch_tensors: MLA attention, DSA indexer, dense lead layers.

    llama_model_deepseek32 loads the same tensors (its indexer tensors required) and keys.
    """
    p = Plan(arch, n_layers, [], [])
    n_embd, n_head, n_vocab = h["n_embd"], h["n_head"], h["n_vocab"]
    q_lora, kv_lora, rope, nope, v_head = h["q_lora"], h["kv_lora"], h["rope_dims"], h["qk_nope"], h["v_head"]
    n_expert, n_used, n_shared, n_ff_exp, n_ff = h["n_expert"], h["n_expert_used"], h["n_expert_shared"], h["n_ff_exp"], h["n_ff"]
    idx_heads, idx_dim = h["indexer_heads"], h["indexer_dim"]
    dense = min(h["leading_dense"], n_layers)
    depth = h["n_layers"]
    routed_down = writer(n_ff_exp, depth, math.sqrt(n_used) / h["expert_weights_scale"])

    p.add("context_length", h["n_ctx"], "u32")
    p.add("embedding_length", n_embd, "u32")
    p.add("block_count", n_layers, "u32")
    p.add("feed_forward_length", n_ff, "u32")
    p.add("leading_dense_block_count", dense, "u32")
    p.add("attention.head_count", n_head, "u32")
    p.add("attention.head_count_kv", 1, "u32")
    p.add("attention.key_length", kv_lora + rope, "u32")
    p.add("attention.value_length", kv_lora, "u32")
    p.add("attention.key_length_mla", nope + rope, "u32")
    p.add("attention.value_length_mla", v_head, "u32")
    p.add("attention.q_lora_rank", q_lora, "u32")
    p.add("attention.kv_lora_rank", kv_lora, "u32")
    p.add("rope.dimension_count", rope, "u32")
    p.add("rope.freq_base", h["rope_freq_base"], "f32")
    p.add("attention.layer_norm_rms_epsilon", h["rms_eps"], "f32")
    p.add("expert_count", n_expert, "u32")
    p.add("expert_used_count", n_used, "u32")
    p.add("expert_shared_count", n_shared, "u32")
    p.add("expert_feed_forward_length", n_ff_exp, "u32")
    p.add("expert_weights_scale", h["expert_weights_scale"], "f32")
    p.add("expert_weights_norm", True, "bool")
    p.add("expert_gating_func", 2, "u32")  # sigmoid
    p.add("attention.indexer.head_count", idx_heads, "u32")
    p.add("attention.indexer.key_length", idx_dim, "u32")
    p.add("attention.indexer.top_k", h["indexer_top_k"], "u32")

    p.tensor("token_embd.weight", (n_embd, n_vocab), init=EMBEDDING)
    for i in range(n_layers):
        b = f"blk.{i}"
        p.tensor(f"{b}.attn_norm.weight", (n_embd,), "norm")
        p.tensor(f"{b}.attn_q_a_norm.weight", (q_lora,), "norm")
        p.tensor(f"{b}.attn_kv_a_norm.weight", (kv_lora,), "norm")
        p.tensor(f"{b}.attn_q_a.weight", (n_embd, q_lora))
        p.tensor(f"{b}.attn_q_b.weight", (q_lora, n_head * (nope + rope)))
        p.tensor(f"{b}.attn_kv_a_mqa.weight", (n_embd, kv_lora + rope))
        p.tensor(f"{b}.attn_k_b.weight", (nope, kv_lora, n_head), init=reader(kv_lora))  # a slice of wkv_b (reads the latent)
        p.tensor(f"{b}.attn_v_b.weight", (kv_lora, v_head, n_head))
        p.tensor(f"{b}.attn_output.weight", (n_head * v_head, n_embd), init=writer(n_head * v_head, depth))
        p.tensor(f"{b}.ffn_norm.weight", (n_embd,), "norm")
        p.tensor(f"{b}.indexer.k_norm.weight", (idx_dim,), "norm")
        p.tensor(f"{b}.indexer.k_norm.bias", (idx_dim,), "f32", BIAS)
        p.tensor(f"{b}.indexer.proj.weight", (n_embd, idx_heads))
        p.tensor(f"{b}.indexer.attn_k.weight", (n_embd, idx_dim))
        p.tensor(f"{b}.indexer.attn_q_b.weight", (q_lora, idx_heads * idx_dim))
        if i < dense:
            p.tensor(f"{b}.ffn_gate.weight", (n_embd, n_ff))
            p.tensor(f"{b}.ffn_down.weight", (n_ff, n_embd), init=writer(n_ff, depth))
            p.tensor(f"{b}.ffn_up.weight", (n_embd, n_ff))
        else:
            p.tensor(f"{b}.ffn_gate_inp.weight", (n_embd, n_expert))
            p.tensor(f"{b}.exp_probs_b.bias", (n_expert,), "f32", BIAS)
            p.tensor(f"{b}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), "expert")
            p.tensor(f"{b}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), "expert", routed_down)
            p.tensor(f"{b}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), "expert")
            p.tensor(f"{b}.ffn_gate_shexp.weight", (n_embd, n_ff_exp * n_shared))
            p.tensor(f"{b}.ffn_down_shexp.weight", (n_ff_exp * n_shared, n_embd), init=writer(n_ff_exp * n_shared, depth))
            p.tensor(f"{b}.ffn_up_shexp.weight", (n_embd, n_ff_exp * n_shared))
    p.tensor("output_norm.weight", (n_embd,), "norm")
    p.tensor("output.weight", (n_embd, n_vocab))
    return p


PLANNERS: dict[str, Callable[[dict, int], Plan]] = {
    "llama": _plan_llama,
    "deepseek4": _plan_deepseek4,
    "glm-dsa": _plan_glm_dsa,
    "deepseek32": lambda h, n_layers: _plan_glm_dsa(h, n_layers, arch="deepseek32"),
}
