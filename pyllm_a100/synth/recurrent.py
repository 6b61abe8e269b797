"""Layouts of recurrent (state-space) architectures for :mod:`pyllm_a100.synth`.

``tiny-mamba`` is Mamba-1 as the pinned llama.cpp loads it (``src/models/mamba.cpp``:
``ssm_in``, a depthwise ``ssm_conv1d``, ``ssm_x``/``ssm_dt`` projections, ``ssm_a``,
``ssm_d``, ``ssm_out``; inner size twice the width, the only expansion it accepts).
llama.cpp treats it as recurrent (``llama_model_is_recurrent``): one state per sequence
instead of a KV cache, which is what llama-cpp-python's prompt-cache tests exercise.

Tensors follow the synth package's init rule (its docstring): the embedding, readers and the
residual writer ``ssm_out`` as there; the depthwise convolution reads ``d_conv`` taps
(``reader(d_conv)``); Mamba's own initialization for the rest: ``ssm_a`` = ``-exp(A_log)``
with ``A_log = log(1..d_state)`` (a decaying state, as every real checkpoint), ``ssm_d``
near 1, the time-step bias near ``softplus^-1(0.02)`` (-4). The convolution weights,
``ssm_a``/``ssm_d`` and the biases are ``f32`` (ggml's ``ssm_conv``/``ssm_scan`` read them as F32).

synth.presets adds :data:`PLANNERS` and :data:`PRESETS` to its own tables.
"""

from __future__ import annotations

from .plan import BIAS, EMBEDDING, GAIN, Init, Plan, reader, writer


def _plan_mamba(h: dict, n_layers: int) -> Plan:
    """As llama_model_mamba::load_arch_hparams / load_arch_tensors."""

    p = Plan("mamba", n_layers, [], [])
    n_embd, d_conv, d_state, dt_rank = h["n_embd"], h["d_conv"], h["d_state"], h["dt_rank"]
    d_inner, depth = 2 * n_embd, h["n_layers"]
    decay = Init(mean=tuple(-float(n + 1) for _ in range(d_inner) for n in range(d_state)))  # -exp(log(1..d_state))
    p.add("context_length", h["n_ctx"], "u32")
    p.add("embedding_length", n_embd, "u32")
    p.add("block_count", n_layers, "u32")
    p.add("feed_forward_length", 0, "u32")
    p.add("attention.head_count", 0, "u32")
    p.add("attention.layer_norm_rms_epsilon", 1e-5, "f32")
    p.add("ssm.conv_kernel", d_conv, "u32")
    p.add("ssm.inner_size", d_inner, "u32")
    p.add("ssm.state_size", d_state, "u32")
    p.add("ssm.time_step_rank", dt_rank, "u32")
    p.tensor("token_embd.weight", (n_embd, h["n_vocab"]), init=EMBEDDING)
    for i in range(n_layers):
        b = f"blk.{i}"
        p.tensor(f"{b}.attn_norm.weight", (n_embd,), "norm")
        p.tensor(f"{b}.ssm_in.weight", (n_embd, 2 * d_inner))
        p.tensor(f"{b}.ssm_conv1d.weight", (d_conv, d_inner), "f32", reader(d_conv))
        p.tensor(f"{b}.ssm_conv1d.bias", (d_inner,), "f32", BIAS)
        p.tensor(f"{b}.ssm_x.weight", (d_inner, dt_rank + 2 * d_state))
        p.tensor(f"{b}.ssm_dt.weight", (dt_rank, d_inner))
        p.tensor(f"{b}.ssm_dt.bias", (d_inner,), "f32", Init(std=0.5, mean=-4.0))
        p.tensor(f"{b}.ssm_a", (d_state, d_inner), "f32", decay)
        p.tensor(f"{b}.ssm_d", (d_inner,), "f32", GAIN)
        p.tensor(f"{b}.ssm_out.weight", (d_inner, n_embd), init=writer(d_inner, depth))
    p.tensor("output_norm.weight", (n_embd,), "norm")
    p.tensor("output.weight", (n_embd, h["n_vocab"]))
    return p


PLANNERS = {"mamba": _plan_mamba}

# Keyword arguments of synth.Preset (synth.presets builds them).
PRESETS = (
    dict(name="tiny-mamba", family="mamba", description="2-layer Mamba-1 (recurrent state, no KV cache), 256 wide",
         hparams=dict(n_layers=2, n_embd=256, d_conv=4, d_state=16, dt_rank=16, n_vocab=1024, n_ctx=4096),
         default_type="f16"),
)
