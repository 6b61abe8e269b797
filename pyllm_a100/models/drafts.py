"""Speculative-decoding drafts for llama-server: which kind a draft GGUF is, whether it fits the model.

The pinned llama.cpp runs several draft kinds (``--spec-type``): ``draft-dspark`` (a
DeepSeek-V4 DSpark head: architecture ``dflash`` with a ``markov_w1`` tensor),
``draft-dflash`` (``dflash`` without it), ``draft-mtp`` (a NextN/MTP block: the model's own
architecture with ``blk.{block_count-1}.nextn.eh_proj``; an ``mtp-*`` sidecar, or the
model itself when its GGUF keeps the block) and ``draft-simple`` (any small model with the
same vocabulary). :func:`detect` mirrors ``common_speculative_types_from_gguf`` on the
header pyllm already reads; :func:`resolve` checks a draft against the model and refuses a
mismatch in one line before llama-server starts; :meth:`Draft.argv` is its flags.

DSpark, DFlash and MTP read the target's hidden states inside llama.cpp, so they work
through llama-server only; llama-cpp-python's in-process ``draft_model=`` is a Python-side
token proposer (see docs/speculative.md).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path

from ..errors import ModelError
from .fetch import SIDECAR_PREFIXES, read_manifest
from .gguf_files import ModelFiles, resolve_model

AUTO = "auto"
SPEC_TYPES = ("draft-simple", "draft-mtp", "draft-dspark", "draft-dflash")
# Tokens a DSpark/DFlash/MTP draft proposes a step when --draft-max is not given. Measured (docs/performance.md and
# docs/speculative.md: the 43-layer DeepSeek-V4, one GPU, at DSpark's published mean accepted lengths 2.5
# and 2.9 made synthetic): DSpark 2 drafted 1.23-1.35x plain decoding, 3: 1.18-1.31x, 4: 1.09-1.17x, 7 (the trained
# block, llama-server's own default): 0.78x; MTP 2 > 3 > 4 alike; under the A100 dispatch too (DSpark 2: 1.36x, 3:
# 1.20x). A MoE verify reads more experts with every token it checks, so a longer draft costs more than it wins at
# these acceptances. A small-model draft (draft-simple) keeps llama-server's default (up to 16 tokens, stopped early
# below its confidence threshold). `pyllm bench speculate` finds the best length for your model, text and box.
DEFAULT_MAX = 2


class DraftError(ModelError, ValueError):
    """``--draft tiny-llama.gguf: its vocabulary (1024 tokens, llama) differs from tiny-deepseek4's (...): ...``"""


class DraftNotFound(ModelError, FileNotFoundError):
    """``--draft auto: no draft beside model.gguf: fetch it with pyllm fetch REPO --draft ...``"""


@dataclasses.dataclass(frozen=True)
class Draft:
    """A checked draft: the file (None: the model's own NextN block) and llama-server's speculative type."""

    files: ModelFiles | None
    spec_type: str
    n_max: int | None = None

    def argv(self) -> list[str]:
        argv = ["--spec-type", self.spec_type]
        if self.files is not None:
            argv[:0] = ["--spec-draft-model", str(self.files.first)]
        if self.n_max is not None:
            argv += ["--spec-draft-n-max", str(self.n_max)]
        return argv

    @property
    def longest(self) -> int | None:
        """The most tokens this draft proposes a step, where the draft itself bounds it: a DFlash/DSpark head drafts
        within its trained block (llama.cpp clamps --spec-draft-n-max to it); None for drafts without such a bound."""
        if self.files is None or self.files.architecture != "dflash":
            return None
        meta = self.files.metadata
        block = int(meta.get("dflash.block_size") or 16)  # llama.cpp's default when the key is absent
        anchor = str(meta.get("dflash.sample_from_anchor", "true")).lower() not in ("false", "0")
        return block if self.spec_type == "draft-dspark" and anchor else block - 1

    def with_default_max(self) -> Draft:
        """This draft with ``n_max`` set to :data:`DEFAULT_MAX` (within its block) when none was given; a
        draft-simple draft keeps llama-server's own default."""
        if self.n_max is not None or self.spec_type == "draft-simple":
            return self
        return dataclasses.replace(self, n_max=min(DEFAULT_MAX, self.longest or DEFAULT_MAX))

    def describe(self) -> dict[str, object]:
        """What `pyllm ps` and the state file show."""
        return {"path": str(self.files.first) if self.files else "(the model's own MTP block)",
                "spec_type": self.spec_type, "n_max": self.n_max}


def _block_count(files: ModelFiles) -> int:
    return int(files.metadata.get(f"{files.architecture}.block_count") or 0)


def has_nextn(files: ModelFiles) -> bool:
    """The GGUF carries an MTP/NextN block as its last layer (llama.cpp's own probe)."""
    n = _block_count(files)
    return n > 0 and f"blk.{n - 1}.nextn.eh_proj.weight" in files.tensor_bytes


def detect(files: ModelFiles) -> str:
    """The ``--spec-type`` llama.cpp would pick for this draft file (``draft-simple`` when none)."""
    if files.architecture == "dflash":
        return "draft-dspark" if "markov_w1.weight" in files.tensor_bytes else "draft-dflash"
    return "draft-mtp" if has_nextn(files) else "draft-simple"


def refuse_as_model(files: ModelFiles) -> None:
    """A DSpark/DFlash/EAGLE3 head or an MTP-only file cannot be served on its own: say which model it belongs with."""
    if files.architecture in ("dflash", "eagle3") or (has_nextn(files) and _trunk(files) == 0) or (
            has_nextn(files) and "blk.0.attn_norm.weight" not in files.tensor_bytes):
        kind = detect(files) if files.architecture != "eagle3" else "draft-eagle3"
        raise DraftError(f"{files.first.name} is a speculative-decoding draft ({kind}), not a model: serve its model "
                         f"and add --draft {shlex.quote(str(files.first))}")


def _vocab(files: ModelFiles) -> tuple:
    m = files.metadata
    return (files.n_vocab, m.get("tokenizer.ggml.model"), m.get("tokenizer.ggml.pre"),
            m.get("tokenizer.ggml.bos_token_id"), m.get("tokenizer.ggml.eos_token_id"))


def _n_embd(files: ModelFiles) -> int:
    return int(files.metadata.get(f"{files.architecture}.embedding_length") or 0)


def _trunk(files: ModelFiles) -> int:
    return _block_count(files) - int(files.metadata.get(f"{files.architecture}.nextn_predict_layers") or 0) * has_nextn(files)


def check(model: ModelFiles, draft: ModelFiles, spec_type: str, label: str) -> None:
    """Raise DraftError when llama.cpp could not run ``draft`` beside ``model``."""
    if _vocab(draft) != _vocab(model):
        nv, tok, pre = _vocab(draft)[:3]
        mv, mtok, mpre = _vocab(model)[:3]
        raise DraftError(f"--draft {label}: its vocabulary ({nv} tokens, {tok}/{pre}) differs from {model.first.name}'s "
                         f"({mv} tokens, {mtok}/{mpre}): a draft must share the model's tokenizer; use the draft made for this model")
    if spec_type in ("draft-dspark", "draft-dflash"):
        if spec_type == "draft-dspark" and model.architecture != "deepseek4":
            raise DraftError(f"--draft {label} is a DeepSeek-V4 DSpark draft but {model.first.name} is {model.architecture}: "
                             "use it with a deepseek4 model, or pick the draft made for this model")
        if _n_embd(draft) != _n_embd(model):
            raise DraftError(f"--draft {label}: width {_n_embd(draft)} differs from {model.first.name}'s {_n_embd(model)}: "
                             "the draft was made for another model")
        targets = draft.metadata.get("dflash.target_layers") or []
        if any(int(t) > _trunk(model) for t in targets):
            raise DraftError(f"--draft {label} reads target layers {list(targets)} but {model.first.name} has {_trunk(model)}: "
                             "the draft was made for a deeper model (a synthetic draft: write it with the same --layers)")
    elif spec_type == "draft-mtp":
        if draft.architecture != model.architecture:
            raise DraftError(f"--draft {label} is an MTP block of a {draft.architecture} model but {model.first.name} is "
                             f"{model.architecture}: use the mtp-* file made for this model")
        if _n_embd(draft) != _n_embd(model) or _trunk(draft) != _trunk(model):
            raise DraftError(f"--draft {label}: its MTP block follows layer {_trunk(draft)} of a {_n_embd(draft)}-wide model, "
                             f"{model.first.name} has {_trunk(model)} layers {_n_embd(model)} wide: use the mtp-* file made for it")


def sidecars(model: ModelFiles) -> list[Path]:
    """Draft sidecars beside the model: named by the fetch manifest, or ``dspark-*``/``mtp-*`` GGUFs in its folder."""
    folder = model.first.parent
    found: list[Path] = []
    for root in (folder, *folder.parents[:2]):
        manifest = read_manifest(root)
        if manifest:
            for pair in manifest.get("drafts", []):
                if Path(root / pair.get("model", "")).resolve() == model.first:
                    found.append((root / pair["draft"]).resolve())
            break
    if not found:
        found = sorted(p.resolve() for p in folder.glob("*.gguf") if p.name.lower().startswith(SIDECAR_PREFIXES))
    return found


def check_n_max(n_max: int | None, label: str) -> None:
    """Raise DraftError unless ``n_max`` is None or 1..64 (``label``: how the caller spells the option)."""
    if n_max is not None and (isinstance(n_max, bool) or not isinstance(n_max, int) or not 1 <= n_max <= 64):
        raise DraftError(f"{label}{n_max!r}: give the number of tokens drafted per step, 1 to 64 (unset: {DEFAULT_MAX} for "
                         "DSpark/DFlash/MTP drafts)")


def resolve(model: ModelFiles, spec: str | os.PathLike[str], n_max: int | None = None) -> Draft:
    """Check ``--draft PATH|auto`` against ``model`` (all errors one line) and return the flags' source."""
    text = str(spec)
    check_n_max(n_max, "--draft-max ")
    if not text.strip():
        raise DraftError(f"--draft {text!r}: give a draft GGUF file, or auto for the one `pyllm fetch --draft` put beside "
                         "the model")
    if text == AUTO:
        found = sidecars(model)
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise DraftError(f"--draft auto: {len(found)} drafts beside {model.first.name} ({names}): name one with --draft PATH")
        if not found:
            if has_nextn(model):
                return Draft(None, "draft-mtp", n_max)
            raise DraftNotFound(f"--draft auto: no draft beside {model.first.name} and it has no MTP block: fetch one with "
                                "pyllm fetch REPO --include ... --draft (hub sidecars are named dspark-*/mtp-*), or give --draft PATH")
        text = str(found[0])
    try:
        files = resolve_model(text)
    except ModelError as exc:
        raise type(exc)(f"--draft: {exc}") from exc
    if files.first == model.first:
        if not has_nextn(model):
            raise DraftError(f"--draft {text} is the model itself and it has no MTP block: give a separate draft file")
        return Draft(None, "draft-mtp", n_max)
    spec_type = detect(files)
    check(model, files, spec_type, text)
    return Draft(files, spec_type, n_max)


# --- in-process (llama-cpp-python) ------------------------------------------------------------

class InProcessUnsupported(DraftError):
    """``draft=dspark.gguf: DSpark drafts read the target's hidden states inside llama.cpp: use pyllm serve --draft``"""
