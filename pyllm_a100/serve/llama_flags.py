"""llama-server's own flags that pyllm reads, in one table, and the one reader of the user's flags after ``--``.

``pyllm serve MODEL -- FLAGS`` passes FLAGS to llama-server as given. pyllm must still know what some of them say:
a flag that sizes the KV pool or the slots takes that job from the memory plan; a scheduling flag wins over serve's
default; ``-sm tensor`` and the flags it needs are checked; a file a flag names is made absolute for a detached
supervisor. Each such flag is one :class:`Flag` row of :data:`FLAGS` (its spellings, what it is about, whether it
takes a value), and :func:`read` goes over the arguments once.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

SIZING, SCHEDULING, SPLIT, TENSOR, PATH = "sizing", "scheduling", "split", "tensor", "path"
ALL_LAYERS = 999  # --n-gpu-layers' "every layer"


@dataclasses.dataclass(frozen=True)
class Flag:
    """One llama-server flag: its spellings, its role for pyllm, the key pyllm knows it by, and whether a value follows."""

    names: tuple[str, ...]
    role: str
    key: str
    takes_value: bool = True

    @property
    def long(self) -> str:
        return max(self.names, key=len)


def _paths(*names: str) -> tuple[Flag, ...]:
    return tuple(Flag((name,), PATH, name) for name in names)


FLAGS: tuple[Flag, ...] = (
    # what sizes the KV pool or the slots: given after --, serve plans no pool and passes only what they left out
    Flag(("-c", "--ctx-size"), SIZING, "ctx"),
    Flag(("-np", "--parallel"), SIZING, "slots"),
    Flag(("-kvu", "--kv-unified"), SIZING, "pool", takes_value=False),
    Flag(("-no-kvu", "--no-kv-unified"), SIZING, "pool", takes_value=False),
    Flag(("--kv-unified-per-slot",), SIZING, "pool"),
    Flag(("--prefill-lane-ctx",), SIZING, "lane"),
    # serve's scheduling options (ServeOptions fields of these names): given after --, the user's value is passed
    Flag(("-b", "--batch-size"), SCHEDULING, "batch_size"),
    Flag(("--decode-latency-target",), SCHEDULING, "decode_latency_target"),
    Flag(("--prefill-min-chunk",), SCHEDULING, "prefill_min_chunk"),
    Flag(("--prefill-lane",), SCHEDULING, "prefill_lane"),
    # the split mode, and what --split-mode tensor requires (flash attention, an unquantized cache, --fit off)
    Flag(("-sm", "--split-mode"), SPLIT, "split_mode"),
    Flag(("-fa", "--flash-attn"), TENSOR, "flash_attn"),
    Flag(("-fit", "--fit"), TENSOR, "fit"),
    Flag(("-ctk", "--cache-type-k"), TENSOR, "cache_type_k"),
    Flag(("-ctv", "--cache-type-v"), TENSOR, "cache_type_v"),
    # flags whose value is a local file or folder (the pinned common/arg.cpp's FNAME/PATH/FILE options)
    *_paths("-m", "--model", "-md", "--model-draft", "--spec-draft-model", "-mm", "--mmproj", "--lora", "--lora-scaled",
            "--control-vector", "--control-vector-scaled", "--grammar-file", "-jf", "--json-schema-file",
            "--chat-template-file", "--api-key-file", "--ssl-key-file", "--ssl-cert-file", "--slot-save-path", "--path",
            "--media-path", "--models-dir", "--models-preset", "--log-file", "--log-prompts-dir", "-lcs",
            "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic", "--prompt-cache", "-sysf", "--system-prompt-file",
            "--ui-config-file", "--webui-config-file", "--mcp-servers-config", "--context-file", "--logits-output-dir"),
)
_BY_NAME: Mapping[str, Flag] = {name: flag for flag in FLAGS for name in flag.names}


def keys(role: str) -> tuple[str, ...]:
    """The keys of one role, in table order, each once (``keys(SCHEDULING)``: the scheduling options)."""
    return tuple(dict.fromkeys(flag.key for flag in FLAGS if flag.role == role))


def long_name(key: str) -> str:
    """The longest spelling of the flag known by ``key`` (serve passes ``--batch-size``, not ``-b``)."""
    return next(flag.long for flag in FLAGS if flag.key == key)


@dataclasses.dataclass(frozen=True)
class UserFlags:
    """What the user's llama-server flags after ``--`` say, read once: each known key given, its last value, and
    each given flag as typed (``-b 256``, ``--batch-size=256``)."""

    values: Mapping[str, str | None] = dataclasses.field(default_factory=dict)  # key -> last value (None: no value)
    typed: tuple[tuple[str, str], ...] = ()  # (key, the flag as typed), in the order given

    def given(self, role: str) -> frozenset[str]:
        """The keys of ``role`` the user's flags set (``given(SIZING)``: "ctx", "slots", "pool")."""
        return frozenset(key for key in self.values if key in keys(role))

    def value(self, key: str) -> str | None:
        return self.values.get(key)

    def as_typed(self, role: str) -> list[str]:
        """The flags of ``role`` as the user typed them, in the order given."""
        return [text for key, text in self.typed if key in keys(role)]


def read(args: Sequence[str], split_mode: str | None = None) -> UserFlags:
    """One pass over the user's flags after ``--``: the known ones and their values (``-c 4096`` or ``--ctx-size=4096``).
    ``split_mode``: serve's own --split-mode, which wins over an ``-sm`` there."""
    values: dict[str, str | None] = {}
    typed: list[tuple[str, str]] = []
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        flag = _BY_NAME.get(name)
        if flag is None or flag.role == PATH:
            continue
        value = None
        if flag.takes_value:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        values[flag.key] = value
        typed.append((flag.key, arg if eq or not flag.takes_value else " ".join(args[i:i + 2])))
    if split_mode is not None:
        values["split_mode"] = split_mode
    return UserFlags(values, tuple(typed))


def absolute_paths(args: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """``args`` with the value of every path flag made absolute (``-md d.gguf``, ``--lora=x.gguf``), so a
    supervisor running elsewhere (cwd ``/``) finds the same files."""
    base = Path(cwd or os.getcwd())

    def absolute(value: str) -> str:
        if not value:
            return value
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else base / path)

    out: list[str] = []
    expect = False
    for arg in args:
        name, eq, value = arg.partition("=")
        is_path = name in _BY_NAME and _BY_NAME[name].role == PATH
        if expect:
            out.append(absolute(arg))
            expect = False
        elif arg.startswith("-") and eq and is_path:
            out.append(f"{name}={absolute(value)}")
        else:
            expect = is_path and not eq
            out.append(arg)
    return out
