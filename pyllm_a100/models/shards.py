"""Shard-set naming (``NAME-0000k-of-0000N.gguf``): the one place that knows it.

Shared by :mod:`pyllm_a100.models.gguf_files` (local models) and :mod:`pyllm_a100.models.fetch` (hub
listings), so neither imports the other for it.
"""

from __future__ import annotations

import re
from pathlib import Path

SHARD_RE = re.compile(r"^(?P<base>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_name(base: str, index: int, count: int) -> str:
    return f"{base}-{index:05d}-of-{count:05d}.gguf"


def set_members(first: Path) -> list[Path]:
    """Every file of the set ``first`` names (shard k of N -> all N shards; a plain .gguf -> itself)."""
    match = SHARD_RE.match(first.name)
    if not match:
        return [first]
    count = int(match["count"])
    return [first.with_name(shard_name(match["base"], i, count)) for i in range(1, count + 1)]


def group_sets(files: list[Path]) -> dict[str, list[Path]]:
    """Files grouped into models: key = folder/base name of a shard set, or the single file's path."""
    sets: dict[str, list[Path]] = {}
    for f in sorted(files):
        match = SHARD_RE.match(f.name)
        key = str(f.parent / match["base"]) if match else str(f)
        sets.setdefault(key, []).append(f)
    return sets
