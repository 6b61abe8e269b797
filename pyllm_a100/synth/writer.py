"""Synthetic GGUF models: the tensor layout and metadata of real architectures, random weights.

Tiny presets load and generate in seconds on a CPU (tests, the demo); real-shape presets
(cut in depth with ``layers``) answer "will it fit, how fast will it run" before a
150 GB download. Files are written tensor by tensor in bounded chunks through the
``gguf`` package's writer, so memory does not grow with model size, and the same seed
gives the same bytes. Layouts follow the pinned llama.cpp's loaders
(``src/models/deepseek4.cpp``, ``glm-dsa.cpp``, ``llama.cpp``) and its converter
(``conversion/deepseek.py``); values marked ``assumed`` in a preset are not from a
public config.

Weights: one rule for every preset and weight type, so activations stay in the ranges a
trained model produces (unit-RMS inputs to every projection, each layer adding a modest
update to the residual stream, routers whose scores are spread, not tied). Every tensor
carries an :class:`Init`; each value is ``mean + std * z``, ``z ~ N(0, 1)`` from a stream
of its own (seed, architecture, tensor name), and a quantized type stores the same
distribution (block scales chosen for ``std``; quantized tensors have mean 0):

- embeddings ``std = 1``: the residual stream enters the first layer at unit RMS and
  each layer changes it by a fraction, as in the middle layers of a trained model. A deep
  model builds that stream in its first layers (large early updates); a model of a few
  layers has none, so its embedding carries the stream. Trained checkpoints store smaller
  embeddings (about 0.01-0.05), but every layer reads the stream through an RMSNorm: only
  the ratio of the carried stream to the layers' updates shapes the computation;
- a projection that reads an activation (``reader``): ``std = 1/sqrt(fan_in)``, fan_in
  the dimension it contracts (ggml's ``ne[0]``; MLA's ``attn_k_b`` the latent rank, as
  the ``wkv_b`` it is split from). Routers, the output head, indexers, compressors and
  the hyper-connection ``*_fn`` mixers are readers;
- a projection that writes into the residual stream (``writer``: attention output,
  FFN/shared/routed-expert down): ``std = 1/sqrt(fan_in * 2 * depth)``, depth the
  preset's full layer count (a model cut with ``--layers`` keeps the full model's
  per-layer weights): all layers together add about one unit to the stream. The routed
  experts' down is further scaled by ``sqrt(experts used) / expert_weights_scale`` so
  the weighted sum of the chosen experts has one expert's scale;
- norm gains ``1 +- 0.1``; biases (``exp_probs_b`` router correction, LayerNorm bias)
  ``N(0, 0.01^2)``. DeepSeek-V3's correction biases sit on a large common offset (about
  +2 to +5), which changes no choice: only their spread across experts does, drawn
  small beside the spread of the router scores (router logits come out near N(0, 1));
  attention sinks ``N(0, 1)``, logits on the scale of attention scores; compressor
  position biases ``N(0, 0.1^2)``;
- hyper-connections (DeepSeek-V4) start at their identity point plus noise 0.1:
  ``hc_*_base`` makes the pre-weights ``1/hc`` (the mean of the streams), the
  post-weights 1 and the Sinkhorn comb 0.9 on its diagonal; ``hc_*_scale`` is 0.1, so
  the token-dependent part moves them a little;
- hash-routing tables (I32) name ``n_expert_used`` distinct experts per token.

Other planners (architectures added in other modules) build a :class:`Plan` with
:meth:`Plan.tensor` and these initializers; :func:`draw` is the one place values are
generated.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import resource
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PyllmError
from .vocab import PRE_TOKENIZER, build_vocab

WEIGHT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "ud-q8-k-xl", "nvfp4-mix")
# Architectures whose graph at the pin multiplies routed experts by their per-expert NVFP4 ``scale_2``
# (``ffn_*_exps.scale``, read by build_moe_ffn): an NVFP4 mix of any other one would load and compute wrong.
NVFP4_SCALED_ARCHS = ("glm-dsa", "deepseek32")
CHUNK_BYTES = 32 << 20  # bytes generated and written at a time
CHAT_TEMPLATE = "deepseek-ai-DeepSeek-V4.jinja"


class SynthError(PyllmError, ValueError):
    """``unknown preset 'x': choose one of tiny-deepseek4, ...``"""


# --- tensor plans -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Init:
    """How a tensor's values are drawn: ``mean + std * N(0, 1)`` per element.

    ``mean`` is a number or one value per element (small tensors: hyper-connection bases);
    ``high`` makes an I32 hash-routing table of ids in ``[0, high)`` instead.
    """

    std: float = 0.0
    mean: float | tuple[float, ...] = 0.0
    high: int = 0


def reader(fan_in: int) -> Init:
    """A projection that reads an activation: unit-RMS in, unit-RMS out."""
    return Init(std=1.0 / math.sqrt(fan_in))


def writer(fan_in: int, depth: int, factor: float = 1.0) -> Init:
    """A projection whose output is added to the residual stream: all ``depth`` layers together add about one unit."""
    return Init(std=factor / math.sqrt(fan_in * 2 * depth))


EMBEDDING = Init(std=1.0)  # the residual stream enters the first layer at unit RMS
GAIN = Init(std=0.1, mean=1.0)  # RMSNorm / LayerNorm weights
BIAS = Init(std=0.01)  # router correction biases, LayerNorm biases
SINKS = Init(std=1.0)  # attention sink logits
POSITION_BIAS = Init(std=0.1)  # compressor position biases (APE)


def hc_base(hc: int, comb: bool = True) -> Init:
    """Hyper-connection bases at the identity point: pre 1/hc, post 1, comb 0.9 on the diagonal."""
    pre = [-math.log(hc - 1)] * hc  # sigmoid -> 1/hc
    if not comb:
        return Init(std=0.1, mean=tuple(pre))
    post = [0.0] * hc  # 2 * sigmoid -> 1
    diagonal = math.log(9 * (hc - 1))  # softmax row -> 0.9 on the diagonal, Sinkhorn keeps it
    mix = [diagonal if i == j else 0.0 for i in range(hc) for j in range(hc)]
    return Init(std=0.1, mean=tuple(pre + post + mix))


HC_SCALE = Init(std=0.01, mean=0.1)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor: GGUF name, shape in ggml order (``ne[0]`` contiguous), its role and its values.

    Roles: ``matrix`` (follows the weight type), ``expert`` (routed experts: MXFP4 in the
    UD-like mix), ``norm`` and ``f32`` (always F32: norms, biases, sinks, hyper-connection
    and compressor position tensors), ``index`` (I32 hash-routing table).
    """

    name: str
    ne: tuple[int, ...]
    role: str
    init: Init = Init()

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)


@dataclasses.dataclass
class Plan:
    arch: str
    n_layers: int
    kv: list[tuple[str, Any, str]]  # key, value, gguf type name ("u32", "f32", "bool", "str", "u32[]", "f32[]")
    tensors: list[TensorSpec]

    def add(self, key: str, value: Any, kind: str) -> None:
        self.kv.append((f"{self.arch}.{key}" if not key.startswith(("general.", "tokenizer.")) else key, value, kind))

    def tensor(self, name: str, ne: tuple[int, ...], role: str = "matrix", init: Init | None = None) -> None:
        """Add a tensor; ``init`` defaults to ``reader(ne[0])`` for matrices and experts, ``GAIN`` for norms."""
        ne = tuple(int(n) for n in ne)
        if init is None:
            defaults = {"matrix": reader(ne[0]), "expert": reader(ne[0]), "norm": GAIN}
            if role not in defaults:
                raise SynthError(f"internal: {name} ({role}) needs an explicit init: pass init=BIAS, SINKS, "
                                 "POSITION_BIAS, reader(fan_in) or Init(std=..., mean=...) by the module's rule")
            init = defaults[role]
        if not isinstance(init.mean, (int, float)) and len(init.mean) != math.prod(ne):
            raise SynthError(f"internal: {name} has {math.prod(ne)} elements but {len(init.mean)} means")
        self.tensors.append(TensorSpec(name, ne, role, init))


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

    ``arch`` names the keys' prefix: ``dflash`` for a DSpark draft's stages (synth_drafts.py).
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


# --- presets ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    family: str
    description: str
    hparams: dict
    default_type: str
    assumed: tuple[str, ...] = ()

    @property
    def layers(self) -> int:
        return self.hparams["n_layers"]


_DEEPSEEK_V4_FLASH = dict(
    n_layers=43, n_embd=4096, n_head=64, head_dim=512, rope_dims=64, n_vocab=129280, n_ctx=1048576,
    q_lora=1024, o_lora=1024, o_groups=8, n_expert=256, n_expert_used=6, n_expert_shared=1, n_ff_exp=2048,
    hash_layers=3, sliding_window=128, indexer_heads=64, indexer_dim=128, indexer_top_k=512,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_clamp=10.0, rms_eps=1e-6,
    rope_freq_base=10000.0, compress_rope_freq_base=160000.0, expert_weights_scale=1.5,
)
_TINY_DEEPSEEK4 = dict(
    _DEEPSEEK_V4_FLASH,
    # Only the sizes shrink. As tests/test-llama-archs.cpp's deepseek4 model (head size 64 so
    # GPU flash attention kernels apply; a top-k larger than any context keeps CPU and GPU
    # results comparable), plus one hash-routed layer and 8 experts so routing is exercised.
    n_layers=4, n_embd=512, n_head=8, head_dim=64, rope_dims=32, n_vocab=1024, n_ctx=4096,
    q_lora=64, o_lora=32, n_expert=8, n_expert_used=2, n_ff_exp=256,
    hash_layers=1, sliding_window=32, indexer_top_k=131072, hc_sinkhorn_iters=2,
    compress_ratios=[0, 0, 4, 128],
)
_TINY_GLM_DSA = dict(
    # MLA dimensions as test-llama-archs.cpp's glm-dsa model (576/512 cache rows, 192/128 heads).
    n_layers=3, n_embd=256, n_head=2, n_vocab=1024, n_ctx=4096, n_ff=384, leading_dense=1,
    q_lora=512, kv_lora=512, rope_dims=64, qk_nope=128, v_head=128,
    n_expert=8, n_expert_used=2, n_expert_shared=1, n_ff_exp=192,
    indexer_heads=64, indexer_dim=128, indexer_top_k=131072,
    rope_freq_base=10000.0, rms_eps=1e-5, expert_weights_scale=2.5,
)
_GLM_5 = dict(
    n_layers=78, n_embd=6144, n_head=64, n_vocab=154880, n_ctx=202752, n_ff=12288, leading_dense=3,
    q_lora=2048, kv_lora=512, rope_dims=64, qk_nope=192, v_head=256,
    n_expert=256, n_expert_used=8, n_expert_shared=1, n_ff_exp=2048,
    indexer_heads=32, indexer_dim=128, indexer_top_k=2048,
    rope_freq_base=1000000.0, rms_eps=1e-5, expert_weights_scale=2.5,
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("tiny-llama", "llama", "2-layer llama, 256 wide: the smallest model that chats",
               dict(n_layers=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=1024, n_ctx=4096), "f16"),
        Preset("tiny-deepseek4", "deepseek4", "4-layer DeepSeek-V4 (CSA/HCA compression, indexer, hyper-connections, hash routing)",
               _TINY_DEEPSEEK4, "f16"),
        Preset("tiny-glm-dsa", "glm-dsa", "3-layer GLM-5 (MLA + DSA indexer, 1 dense + 2 MoE layers)", _TINY_GLM_DSA, "f16"),
        Preset("tiny-deepseek32", "deepseek32", "3-layer DeepSeek-V3.2 (MLA + DSA indexer, 1 dense + 2 MoE layers)",
               _TINY_GLM_DSA, "f16"),
        Preset("deepseek-v4-flash", "deepseek4", "DeepSeek-V4-Flash, real dimensions (284B total / 13B active at 43 layers)",
               _DEEPSEEK_V4_FLASH, "ud-q8-k-xl",
               assumed=("n_ctx=1048576", "rope_freq_base=10000", "compress_rope_freq_base=160000",
                        "rms_eps=1e-6", "expert_weights_scale=1.5", "no YaRN rope scaling keys")),
        Preset("glm-5", "glm-dsa", "GLM-5, real dimensions (744B total / 40B active at 78 layers)", _GLM_5, "ud-q8-k-xl",
               assumed=("all dimensions recalled from zai-org/GLM-5 config.json, not re-read offline",
                        "rope_freq_base=1e6", "expert_weights_scale=2.5")),
    )
}

from . import drafts as synth_drafts, recurrent as synth_recurrent  # noqa: E402  (recurrent layouts: tiny-mamba; drafts; drawn by draw() like every preset)

PLANNERS.update(synth_recurrent.PLANNERS)
PRESETS.update({kw["name"]: Preset(**kw) for kw in synth_recurrent.PRESETS})
PLANNERS.update(synth_drafts.PLANNERS)
PRESETS.update({kw["name"]: Preset(**kw) for kw in synth_drafts.presets()})


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise SynthError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}") from None


def hparams_for(preset_name: str, experts: int | None = None) -> dict:
    """The preset's dimensions, with the routed expert count replaced by ``experts``.

    Fewer experts keep every layer and the per-token work (the same experts are used per
    token) while shrinking the file: the full 43-layer depth fits where 256 experts do not.
    """
    p = preset(preset_name)
    if experts is None:
        return p.hparams
    if "n_expert" not in p.hparams:
        raise SynthError(f"--experts: {p.name} has no routed experts (choose a MoE preset)")
    used = p.hparams["n_expert_used"]
    if not used <= experts <= p.hparams["n_expert"]:
        raise SynthError(f"--experts {experts}: must be between {used} (experts used per token) and {p.hparams['n_expert']} for {p.name}")
    return {**p.hparams, "n_expert": experts}


def plan(preset_name: str, layers: int | None = None, experts: int | None = None) -> Plan:
    p = preset(preset_name)
    n_layers = p.layers if layers is None else layers
    if not 1 <= n_layers <= 512:
        raise SynthError(f"--layers {n_layers}: must be between 1 and 512 ({p.name} has {p.layers})")
    return PLANNERS[p.family](hparams_for(preset_name, experts), n_layers)


# --- weight types and random data -------------------------------------------------------


def ggml_type_for(spec: TensorSpec, weight_type: str):
    """The GGML type a tensor gets under ``weight_type``."""
    from gguf import GGMLQuantizationType as T

    if spec.role in ("norm", "f32"):
        return T.F32
    if spec.role == "index":
        return T.I32
    quantizable = spec.ne[0] % 32 == 0
    if weight_type == "ud-q8-k-xl":
        if spec.role == "expert" and quantizable:
            return T.MXFP4
        return T.Q8_0 if quantizable else T.F16
    if weight_type == "nvfp4-mix":  # as a ModelOpt NVFP4 checkpoint converted by the pin: routed experts NVFP4
        if spec.role == "expert" and spec.ne[0] % 64 == 0:
            return T.NVFP4
        return T.Q8_0 if quantizable else T.F16
    simple = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16}
    if weight_type in simple:
        return simple[weight_type]
    if weight_type in ("q8_0", "q4_0"):
        return (T.Q8_0 if weight_type == "q8_0" else T.Q4_0) if quantizable else T.F16
    raise SynthError(f"unknown weight type {weight_type!r}: choose one of {', '.join(WEIGHT_TYPES)}")


def _file_type(weight_type: str) -> int:
    from gguf import LlamaFileType as F

    return {
        "f32": F.ALL_F32, "f16": F.MOSTLY_F16, "bf16": F.MOSTLY_BF16, "q8_0": F.MOSTLY_Q8_0,
        "q4_0": F.MOSTLY_Q4_0, "ud-q8-k-xl": F.MOSTLY_MXFP4_MOE, "nvfp4-mix": F.MOSTLY_NVFP4,
    }[weight_type]


# NVFP4 as the pin stores it (ggml-common.h block_nvfp4: 4 UE4M3 sub-block scales, then 32 bytes of E2M1 pairs, 64
# values): value = kvalues_mxfp4[q] * ue4m3(d) / 2 (ggml-impl.h ggml_ue4m3_to_fp32), times the expert's scale_2
# (``ffn_*_exps.scale``, F32 per expert) in build_moe_ffn. Unlike the other quantized types (random blocks),
# nvfp4-mix quantizes the very values the f16 file of the same seed holds: its NMSE against that file is the
# quantization's own error. scale_2 = std / 448 puts a sub-block's amax / 6 well inside UE4M3's normal range
# (ModelOpt's per-tensor amax / (6 * 448), with amax near 6 std).
NVFP4_SCALE2_PER_STD = 1 / 448
_FP4_LEVELS = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.float32)  # kvalues_mxfp4 magnitudes (E2M1 doubled)
_FP4_MIDPOINTS = (_FP4_LEVELS[1:] + _FP4_LEVELS[:-1]) / 2


def quantize_nvfp4(values: np.ndarray) -> np.ndarray:
    """float32 values (a multiple of 64) -> NVFP4 blocks (n, 36) uint8, as ggml-quants.c quantize_row_nvfp4_ref.

    The ``gguf`` package (0.19.0) decodes NVFP4 but refuses to encode it. Per 16-value
    sub-block: UE4M3 scale of amax / 6, then each value's nearest of kvalues_mxfp4 * scale (ties to the lower
    index, as best_index_mxfp4's first minimum; -0 is never chosen).
    """
    from gguf.quants import NVFP4

    x = values.reshape(-1, 4, 16).astype(np.float32)
    ue = NVFP4.fp32_to_ue4m3(np.abs(x).max(axis=-1) / 6.0)
    d = NVFP4.ue4m3_to_fp32(ue).astype(np.float32)[..., None]
    scaled = np.divide(np.abs(x), d, out=np.zeros_like(x), where=d > 0)
    level = np.searchsorted(_FP4_MIDPOINTS, scaled, side="left").astype(np.uint8)
    idx = np.where((x < 0) & (level > 0), level + 8, level).astype(np.uint8)
    qs = idx[..., :8] | (idx[..., 8:] << 4)
    return np.concatenate([ue.astype(np.uint8), qs.reshape(-1, 32)], axis=1)


def typed_tensors(the_plan: Plan, weight_type: str) -> list[tuple[TensorSpec, Any]]:
    """Every tensor the file holds under ``weight_type`` with its GGML type.

    ``nvfp4-mix`` adds each NVFP4 expert tensor's per-expert ``scale_2`` (``blk.N.ffn_*_exps.scale``, F32,
    one value per expert), named as the pin's converter names them (conversion/base.py
    ``_flush_nvfp4_experts``) and loaded by llama-model.cpp's generic ``.scale`` pass.
    """
    from gguf import GGMLQuantizationType as T

    out = [(t, ggml_type_for(t, weight_type)) for t in the_plan.tensors]
    if weight_type != "nvfp4-mix":
        return out
    if the_plan.arch not in NVFP4_SCALED_ARCHS:
        raise SynthError(f"--type nvfp4-mix: the pinned llama.cpp's {the_plan.arch} graph ignores NVFP4's per-expert scales "
                         f"(only {', '.join(NVFP4_SCALED_ARCHS)} apply them); choose ud-q8-k-xl (MXFP4 experts) for {the_plan.arch}")
    scales = []
    for spec, ggml_type in out:
        if ggml_type == T.NVFP4:
            scales.append((TensorSpec(spec.name.removesuffix(".weight") + ".scale", (spec.ne[-1],), "f32",
                                      Init(mean=spec.init.std * NVFP4_SCALE2_PER_STD)), T.F32))
    if not scales:
        raise SynthError(f"--type nvfp4-mix: {the_plan.arch} has no routed experts to store in NVFP4; choose q8_0 or q4_0")
    return out + scales


def tensor_nbytes(spec: TensorSpec, ggml_type) -> int:
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[ggml_type]
    return spec.n_elements // block * size


def _rng(seed: int, arch: str, name: str) -> np.random.Generator:
    # the architecture is part of the stream: presets that share a layout (glm-dsa, deepseek32) get independent weights
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(arch.encode()), zlib.crc32(name.encode())])))


def _f16_scales(rng: np.random.Generator, n: int, base: float) -> np.ndarray:
    return (base * rng.uniform(0.5, 1.5, n)).astype(np.float16).view(np.uint8).reshape(n, 2)


def draw(spec: TensorSpec, ggml_type, seed: int, arch: str, *, from_values: bool = False) -> Iterator[bytes]:
    """The tensor's bytes by its :class:`Init`, in pieces of about CHUNK_BYTES, deterministic in (seed, arch, name).

    ``from_values`` (nvfp4-mix): a quantized tensor holds the values the F16 type would draw, quantized (Q8_0 by
    the ``gguf`` package, NVFP4 by :func:`quantize_nvfp4` over value / scale_2), instead of random blocks.
    """
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as T

    rng = _rng(seed, arch, spec.name)
    init = spec.init
    std = np.float32(init.std)
    means = None if isinstance(init.mean, (int, float)) else np.asarray(init.mean, dtype=np.float32)
    block, block_bytes = GGML_QUANT_SIZES[ggml_type]
    row_elems = spec.ne[0]
    rows = spec.n_elements // row_elems
    row_bytes = row_elems // block * block_bytes
    rows_per_chunk = max(1, CHUNK_BYTES // max(row_bytes, 1))
    done = 0
    while done < rows:
        n_rows = min(rows_per_chunk, rows - done)
        n = n_rows * row_elems
        if ggml_type in (T.F32, T.F16, T.BF16):
            values = rng.standard_normal(n, dtype=np.float32) * std
            if means is not None:
                values += means[done * row_elems : done * row_elems + n]
            elif init.mean:
                values += np.float32(init.mean)
            if ggml_type == T.F32:
                yield values.tobytes()
            elif ggml_type == T.F16:
                yield values.astype(np.float16).tobytes()
            else:  # BF16: the top half of each float32
                yield (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        elif ggml_type == T.I32:
            # tid2eid: n_expert_used distinct experts per token
            first = rng.integers(0, init.high, size=n // row_elems, dtype=np.int64)
            ids = (first[:, None] + np.arange(row_elems)[None, :]) % init.high
            yield ids.astype(np.int32).tobytes()
        elif from_values:
            from gguf.quants import quantize

            values = rng.standard_normal(n, dtype=np.float32) * std  # the F16 type's stream, value for value
            if ggml_type == T.NVFP4:
                yield quantize_nvfp4(values / np.float32(init.std * NVFP4_SCALE2_PER_STD)).tobytes()
            else:
                yield quantize(values.reshape(n_rows, row_elems), ggml_type).tobytes()
        else:
            if init.mean != 0.0:
                raise SynthError(f"internal: {spec.name} is quantized ({ggml_type.name}) but its init has a mean")
            n_blocks = n // block
            out = np.frombuffer(rng.bytes(n_blocks * block_bytes), dtype=np.uint8).reshape(n_blocks, block_bytes).copy()
            if ggml_type == T.Q8_0:  # f16 d, 32 x int8 (uniform: std ~ 74)
                out[:, :2] = _f16_scales(rng, n_blocks, init.std / 74.0)
            elif ggml_type == T.Q4_0:  # f16 d, 32 x 4-bit (q - 8: std ~ 4.6)
                out[:, :2] = _f16_scales(rng, n_blocks, init.std / 4.6)
            elif ggml_type == T.MXFP4:  # e8m0 scale (2^(e-128) in ggml), 32 x e2m1 (doubled: std ~ 5.2)
                e = 128 + int(round(math.log2(init.std / 5.2)))
                out[:, 0] = rng.integers(e - 1, e + 2, n_blocks, dtype=np.int64).astype(np.uint8)
            else:
                raise SynthError(f"no random generator for {ggml_type.name}")
            yield out.tobytes()
        done += n_rows


# --- writing ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SynthResult:
    paths: tuple[Path, ...]
    preset: str
    weight_type: str
    layers: int
    n_tensors: int
    bytes_written: int
    seconds: float
    peak_rss: int  # bytes, this process's peak so far

    @property
    def first(self) -> Path:
        return self.paths[0]

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 2**20 / max(self.seconds, 1e-9)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int | None) -> int:
    """``"2G"``, ``"500M"``, ``"64KiB"`` or a number of bytes -> bytes (0: no limit)."""
    if text is None or text == "":
        return 0
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if match is None or float(match[1]) <= 0:
        raise SynthError(f"--split-max-size {text}: not a positive size; use e.g. 500M, 2G or a number of bytes")
    return int(float(match[1]) * 1024 ** " KMGT".index(match[2].upper() or " "))


def _chat_template() -> str | None:
    from ..build.native import native_dir

    path = native_dir() / "templates" / CHAT_TEMPLATE
    return path.read_text() if path.is_file() else None


def _add_kv(writer, key: str, value: Any, kind: str) -> None:
    from gguf import GGUFValueType as V

    scalar = {"u32": V.UINT32, "f32": V.FLOAT32, "bool": V.BOOL, "str": V.STRING, "i32": V.INT32}
    if kind in scalar:
        writer.add_key_value(key, value, scalar[kind])
    else:
        sub = {"u32[]": V.UINT32, "f32[]": V.FLOAT32, "i32[]": V.INT32, "str[]": V.STRING}[kind]
        writer.add_key_value(key, list(value), V.ARRAY, sub_type=sub)


def _stream_tensor(writer, chunks: Iterator[bytes], nbytes: int) -> None:
    """``GGUFWriter.write_tensor_data`` for one tensor, fed in chunks instead of one array.

    Same bookkeeping as the library method (pop the next tensor info of the current
    shard, align, write, pad), without holding the tensor in memory.
    """
    from gguf.gguf_writer import WriterState

    file_id = next(i for i, tensors in enumerate(writer.tensors) if tensors)
    fout = writer.fout[file_id]
    name = next(iter(writer.tensors[file_id]))
    info = writer.tensors[file_id].pop(name)
    assert info.nbytes == nbytes, (name, info.nbytes, nbytes)
    writer.write_padding(fout, fout.tell())
    written = 0
    for chunk in chunks:
        fout.write(chunk)
        written += len(chunk)
    if written != nbytes:
        raise SynthError(f"internal: {name} wrote {written} bytes, planned {nbytes}")
    writer.write_padding(fout, nbytes)
    writer.state = WriterState.WEIGHTS


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _write_error(exc: OSError, output: Path) -> SynthError:
    """An OSError while writing the model, as one line that says what to do (nothing is left behind)."""
    import errno

    folder = output.parent
    if exc.errno == errno.ENOSPC:
        return SynthError(f"the disk under {folder} filled up while writing {output.name} (nothing was left behind): free space, "
                          "pick another folder, or cut depth with --layers")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return SynthError(f"cannot write to {folder} ({exc.strerror}): choose an -o in a writable folder")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return SynthError(f"cannot create {folder}: a part of the path is a file, not a folder ({exc.filename})")
    return SynthError(f"writing {output} failed ({exc.strerror or exc}): nothing was left behind; check the folder and try again")


def synthesize(
    preset_name: str,
    output: str | os.PathLike[str],
    *,
    layers: int | None = None,
    experts: int | None = None,
    weight_type: str | None = None,
    split_max_size: str | int | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> SynthResult:
    """Write a synthetic model; returns the files (shard 1 first) and throughput.

    ``experts`` replaces the routed expert count (MoE presets; see ``hparams_for``).
    ``output`` is the file name (``model.gguf``); with ``split_max_size`` the files are
    ``model-00001-of-0000N.gguf``... Everything is written in a temporary folder beside
    the output and moved into place at the end: no half-written model is ever visible.
    """
    import gguf

    p = preset(preset_name)
    wtype = weight_type or p.default_type
    if wtype not in WEIGHT_TYPES:
        raise SynthError(f"unknown weight type {wtype!r}: choose one of {', '.join(WEIGHT_TYPES)}")
    output = Path(output)
    if output.suffix != ".gguf":
        raise SynthError(f"{output}: the output name must end in .gguf")
    if output.is_dir():
        raise SynthError(f"{output} is a folder: give a file name ending in .gguf")
    max_size = parse_size(split_max_size)
    the_plan = plan(preset_name, layers, experts)
    n_vocab = p.hparams["n_vocab"]
    vocab = build_vocab(n_vocab)
    typed = typed_tensors(the_plan, wtype)
    the_plan = dataclasses.replace(the_plan, tensors=[t for t, _ in typed])
    types = {t.name: ggml_type for t, ggml_type in typed}
    sizes = {t.name: tensor_nbytes(t, types[t.name]) for t in the_plan.tensors}
    total = sum(sizes.values())

    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(output.parent).free
        needed = int(total * 1.01) + (64 << 20)  # the tensors, plus the header and a margin
        if free < needed:
            raise SynthError(
                f"{output.parent} has {_size(free)} free but writing the model needs {_size(needed)} "
                f"({_size(total)} of tensors plus a 1 % + 64 MiB margin): free space, pick another folder, or cut depth with --layers"
            )
        work = Path(tempfile.mkdtemp(prefix=f".{output.stem}.synth-", dir=output.parent))
    except OSError as exc:
        raise _write_error(exc, output) from exc
    final: list[Path] = []
    started = time.monotonic()
    try:
        writer = gguf.GGUFWriter(work / output.name, the_plan.arch, split_max_size=max_size)
        writer.add_name(f"pyllm-synth {p.name}")
        writer.add_file_type(int(_file_type(wtype)))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_key_value("pyllm.synthetic", True, gguf.GGUFValueType.BOOL)
        writer.add_key_value("pyllm.preset", p.name, gguf.GGUFValueType.STRING)
        writer.add_key_value("pyllm.weight_type", wtype, gguf.GGUFValueType.STRING)
        writer.add_key_value("pyllm.seed", int(seed), gguf.GGUFValueType.UINT32)
        for key, value, kind in the_plan.kv:
            _add_kv(writer, key, value, kind)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(PRE_TOKENIZER)
        writer.add_token_list(list(vocab.tokens))
        writer.add_token_types(list(vocab.types))
        writer.add_token_merges(list(vocab.merges))
        writer.add_bos_token_id(vocab.bos_id)
        writer.add_eos_token_id(vocab.eos_id)
        writer.add_pad_token_id(vocab.pad_id)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        template = _chat_template()
        if template:
            writer.add_chat_template(template)
        for t in the_plan.tensors:
            # numpy order is ggml's reversed; the dtype argument only matters for raw_dtype=None
            writer.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), sizes[t.name], raw_dtype=types[t.name])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        done = 0
        for t in the_plan.tensors:
            _stream_tensor(writer, draw(t, types[t.name], seed, the_plan.arch, from_values=wtype == "nvfp4-mix"), sizes[t.name])
            done += sizes[t.name]
            if progress is not None:
                progress(done, total)
        writer.close()
        written = sorted(work.iterdir())
        for f in written:
            target = output.parent / f.name
            os.replace(f, target)
            final.append(target)
    except OSError as exc:
        for f in final:  # never leave part of a shard set behind
            f.unlink(missing_ok=True)
        raise _write_error(exc, output) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - started
    return SynthResult(
        paths=tuple(final),
        preset=p.name,
        weight_type=wtype,
        layers=the_plan.n_layers,
        n_tensors=len(the_plan.tensors),
        bytes_written=sum(f.stat().st_size for f in final),
        seconds=seconds,
        peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )
