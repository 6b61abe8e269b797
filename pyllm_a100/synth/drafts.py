"""Speculative-decoding drafts for :mod:`pyllm_a100.synth`: sidecars that fit a target preset.

A draft preset ``<target>-dspark`` or ``<target>-mtp`` writes the file the pinned llama.cpp
loads with ``-md`` beside the target of the same preset and seed; ``--layers N`` is the
*target's* depth (a target cut with ``--layers 4`` needs its draft written with
``--layers 4``: the draft names target layers and the MTP block's index).

- **DSpark** (``draft-dspark``, DeepSeek-V4 only): architecture ``dflash`` with the Markov
  head, as ``conversion/deepseek.py``'s ``DeepseekV4DSparkModel`` writes it and
  ``src/models/dflash.cpp`` loads it: the target's tokenizer plus a mask token
  (``tokenizer.ggml.mask_token_id``), ``dflash.block_size``, ``dflash.target_layers``
  (layer-input indices into the target, stored +1 as the converter does), DeepSeek-V4
  blocks with uncompressed attention (``compress_ratios`` all 0, no hash routing),
  ``fc`` (the target's hidden states of those layers, concatenated, to the draft width),
  ``enc.output_norm``, ``markov_w1``/``markov_w2``/``conf_proj``. No token embedding or
  output head: the draft reads the target's (``ctx_other`` in dflash.cpp).
- **MTP** (``draft-mtp``): the target's architecture with one NextN block after the
  trunk (``block_count`` = target depth + 1, ``nextn_predict_layers`` = 1), holding only
  that block, ``nextn.eh_proj``/``enorm``/``hnorm``/``shared_head_norm``, and the token
  embedding, output norm and head (plus DeepSeek-V4's output hyper-connection), as
  ``convert_hf_to_gguf.py --mtp`` writes an ``mtp-*`` file. The pin's deepseek4 and
  glm-dsa/deepseek32 loaders accept such an MTP-only file (no trunk tensors). The shared
  tensors have the target's names and architecture, so :func:`synth.draw` gives them the
  target's exact values for the same seed.

Weights are random by the synth package's rule, so a draft proposes tokens the target rarely
accepts (acceptance near 0): these files test the path (loading, flags, exactness), not
the speed-up. Values marked ``assumed`` are not from a public config.
"""

from __future__ import annotations

from .layouts import _plan_deepseek4, _plan_glm_dsa, deepseek4_compress_ratios
from .plan import EMBEDDING, GAIN, Plan, reader


def dspark_target_layers(depth: int) -> list[int]:
    """Three spread target layers (as EAGLE-style drafts), as stored: layer index + 1."""
    picks = sorted({1, max(1, depth // 2), max(1, depth - 1)})
    return [i + 1 for i in picks][-3:]


def _plan_dspark(h: dict, n_layers: int) -> Plan:
    """A DeepSeek-V4 DSpark draft for a target of ``n_layers`` layers."""
    from .vocab import CONTROL_TOKENS, PAD

    stages = h["draft_stages"]
    draft = dict(h, compress_ratios=[0] * stages, hash_layers=0, n_layers=stages)
    p = _plan_deepseek4(draft, stages, arch="dflash")
    p.n_layers = stages
    shared = ("token_embd.weight", "output.weight")  # read from the target
    p.tensors = [t for t in p.tensors if t.name not in shared]
    targets = dspark_target_layers(n_layers)
    n_embd, rank, n_vocab = h["n_embd"], h["markov_rank"], h["n_vocab"]
    p.add("block_size", h["block_size"], "u32")
    p.add("target_layers", targets, "u32[]")
    p.add("tokenizer.ggml.mask_token_id", list(CONTROL_TOKENS).index(PAD), "u32")
    p.tensor("fc.weight", (len(targets) * n_embd, n_embd))
    p.tensor("enc.output_norm.weight", (n_embd,), "norm", GAIN)
    p.tensor("markov_w1.weight", (rank, n_vocab), init=EMBEDDING)  # looked up per token (get_rows)
    p.tensor("markov_w2.weight", (rank, n_vocab), init=reader(rank))
    p.tensor("conf_proj.weight", (n_embd + rank, 1), init=reader(n_embd + rank))
    return p


def _mtp_only(p: Plan, n_layers: int, keep: tuple[str, ...]) -> Plan:
    """Keep the NextN block (index ``n_layers``) and the shared root tensors ``keep``."""
    block = f"blk.{n_layers}."
    p.tensors = [t for t in p.tensors if t.name.startswith(block) or t.name in keep]
    return p


def _nextn(p: Plan, n_layers: int, n_embd: int) -> None:

    b = f"blk.{n_layers}.nextn"
    p.tensor(f"{b}.eh_proj.weight", (2 * n_embd, n_embd), init=reader(2 * n_embd))
    p.tensor(f"{b}.enorm.weight", (n_embd,), "norm")
    p.tensor(f"{b}.hnorm.weight", (n_embd,), "norm")
    p.tensor(f"{b}.shared_head_norm.weight", (n_embd,), "norm")


def _plan_deepseek4_mtp(h: dict, n_layers: int) -> Plan:
    """An ``mtp-*`` sidecar for a DeepSeek-V4 target of ``n_layers`` layers."""

    ratios = list(h.get("compress_ratios") or deepseek4_compress_ratios(n_layers))[:n_layers]
    ratios += [0] * (n_layers - len(ratios)) + [0]  # the MTP block: uncompressed attention (assumed)
    p = _plan_deepseek4(dict(h, compress_ratios=ratios), n_layers + 1)
    p.add("nextn_predict_layers", 1, "u32")
    keep = ("token_embd.weight", "output.weight", "output_norm.weight",
            "output_hc_fn.weight", "output_hc_base.weight", "output_hc_scale.weight")
    _mtp_only(p, n_layers, keep)
    _nextn(p, n_layers, h["n_embd"])
    return p


def _plan_glm_dsa_mtp(h: dict, n_layers: int, arch: str = "glm-dsa", inside: bool = False) -> Plan:
    """An ``mtp-*`` sidecar for a GLM-5 (or DeepSeek-V3.2) target of ``n_layers`` layers; ``inside``: the
    whole model with its NextN block kept (a conversion without ``--no-mtp``)."""

    p = _plan_glm_dsa(h, n_layers + 1, arch=arch)
    p.add("nextn_predict_layers", 1, "u32")
    if not inside:
        _mtp_only(p, n_layers, ("token_embd.weight", "output.weight", "output_norm.weight"))
    _nextn(p, n_layers, h["n_embd"])
    return p


PLANNERS = {
    "deepseek4-dspark": _plan_dspark,
    "deepseek4-mtp": _plan_deepseek4_mtp,
    "glm-dsa-mtp": _plan_glm_dsa_mtp,
    "deepseek32-mtp": lambda h, n_layers: _plan_glm_dsa_mtp(h, n_layers, arch="deepseek32"),
    "glm-dsa-nextn": lambda h, n_layers: _plan_glm_dsa_mtp(h, n_layers, inside=True),
}

_DSPARK_TINY = dict(draft_stages=1, block_size=8, markov_rank=64)
_DSPARK_REAL = dict(draft_stages=1, block_size=8, markov_rank=256)
DSPARK_ASSUMED = ("draft_stages=1", "block_size=8 (7 draft tokens)", "markov_rank=256",
                  "target layers spread over the depth (first, middle, last)", "mask token = the pad token")


def presets(PRESETS: dict) -> list[dict]:  # noqa: N803  (the target presets, synth.presets.PRESETS)
    """Keyword arguments of synth.Preset for each draft preset, built from the target presets."""

    out = []
    for target, extra, assumed in (("tiny-deepseek4", _DSPARK_TINY, ()), ("deepseek-v4-flash", _DSPARK_REAL, DSPARK_ASSUMED)):
        t = PRESETS[target]
        out.append(dict(name=f"{target}-dspark", family="deepseek4-dspark",
                        description=f"DSpark draft (draft-dspark, 1 stage, 7 draft tokens) for {target} of the same seed",
                        hparams=dict(t.hparams, **extra), default_type=t.default_type, assumed=t.assumed + assumed))
    for target in ("tiny-deepseek4", "deepseek-v4-flash", "tiny-glm-dsa", "glm-5", "tiny-deepseek32"):
        t = PRESETS[target]
        out.append(dict(name=f"{target}-mtp", family=f"{t.family}-mtp",
                        description=f"MTP draft (draft-mtp, one NextN block) for {target} of the same seed",
                        hparams=t.hparams, default_type=t.default_type,
                        assumed=t.assumed + ("the NextN block has the trunk's layer layout",)))
    t = PRESETS["tiny-glm-dsa"]
    out.append(dict(name="tiny-glm-dsa-nextn", family="glm-dsa-nextn",
                    description="tiny-glm-dsa with its MTP block inside (pyllm serve --draft auto: draft-mtp on its own weights)",
                    hparams=t.hparams, default_type=t.default_type))
    return out
