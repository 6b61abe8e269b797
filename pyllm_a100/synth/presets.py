"""Named presets (tiny and real dimensions) and the plan of a preset at a depth and expert count."""

from __future__ import annotations

import dataclasses


from .plan import Plan, SynthError
from . import drafts, recurrent
from .layouts import PLANNERS as TRANSFORMER_PLANNERS


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

# Recurrent layouts (tiny-mamba) and speculative drafts add their own planners and presets.
PLANNERS: dict = {**TRANSFORMER_PLANNERS, **recurrent.PLANNERS, **drafts.PLANNERS}
PRESETS.update({kw["name"]: Preset(**kw) for kw in recurrent.PRESETS})
PRESETS.update({kw["name"]: Preset(**kw) for kw in drafts.presets(PRESETS)})


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
