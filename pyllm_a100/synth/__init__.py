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

Chat templates: each preset embeds the template its family's real GGUFs carry, taken from the
pinned tree's ``models/templates/`` (installed into the native dir; ``chat.CHAT_FORMATS``, which
also names each one's tool-call markup and thinking switch), so llama-server picks the same chat format, tool-call markup and reasoning switch as for the real
model: ``deepseek4`` DeepSeek-V4-Flash-0731's (the V4-Flash release real V4-Flash GGUFs embed;
DSML ``<｜DSML｜tool_calls>`` blocks, ``thinking``/``enable_thinking``), ``deepseek32``
DeepSeek-V3.2's (DSML ``function_calls``), ``glm-dsa`` (GLM-5) GLM-4.7-Flash's. The pin ships no
GLM-5 template; GLM-5's own (zai-org/GLM-5; recalled, not re-read offline) keeps GLM-4.7's
format, which is all llama.cpp reads from it: ``[gMASK]<sop>``, ``<|user|>``/``<|assistant|>``/``<|observation|>`` turns,
``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`` with no newlines,
``<think>`` opened by the generation prompt and ``enable_thinking: false`` closing it at once.
GLM-4.6's template writes newlines between the tags and names no ``</think>`` for thinking off,
so it is the further one. Drafts take their target family's template; presets with no chat model
of their own (``tiny-llama``, ``tiny-mamba``, which use DeepSeek's vocabulary) keep
DeepSeek-V4's. The vocabulary stays DeepSeek's for every preset: GLM's markers are plain text to
it, which changes nothing a template or a grammar relies on.

Other planners (architectures added in other modules) build a :class:`Plan` with
:meth:`Plan.tensor` and these initializers; :func:`draw` is the one place values are
generated.

The package: ``chat`` (each family's template: tool-call markup, thinking switch), ``plan``
(Init, TensorSpec, Plan: the shared pieces), ``layouts`` (the transformer architectures),
``recurrent`` (Mamba), ``drafts`` (DSpark/MTP draft layouts), ``presets`` (named dimensions and
the plan of a preset), ``tensors`` (weight types and random bytes), ``vocab`` (the tokenizer) and
``writer`` (GGUF files on disk). Each imports only the ones before it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .layouts import deepseek4_compress_ratios
from .plan import Init, Plan, SynthError, TensorSpec
from .presets import PLANNERS, PRESETS, Preset, hparams_for, plan, preset

if TYPE_CHECKING:
    from .tensors import NVFP4_SCALED_ARCHS, WEIGHT_TYPES, draw, ggml_type_for, quantize_nvfp4, tensor_nbytes, typed_tensors
    from .writer import SynthResult, parse_size, synthesize

# tensors and writer import numpy: they load on first use, so that `pyllm --help` (whose synth help
# lists PRESETS from here) starts without numpy, as it did before.
_LAZY = {
    **dict.fromkeys(("NVFP4_SCALED_ARCHS", "WEIGHT_TYPES", "draw", "ggml_type_for", "quantize_nvfp4", "tensor_nbytes",
                     "typed_tensors"), "tensors"),
    **dict.fromkeys(("SynthResult", "parse_size", "synthesize"), "writer"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value

__all__ = [
    "NVFP4_SCALED_ARCHS", "PLANNERS", "PRESETS", "WEIGHT_TYPES", "Init", "Plan", "Preset", "SynthError", "SynthResult",
    "TensorSpec", "deepseek4_compress_ratios", "draw", "ggml_type_for", "hparams_for", "parse_size", "plan", "preset",
    "quantize_nvfp4", "synthesize", "tensor_nbytes", "typed_tensors",
]
