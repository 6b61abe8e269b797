"""A byte-level BPE vocabulary for synthetic models.

Every UTF-8 text round-trips (the 256 byte tokens cover any input), DeepSeek's chat
special tokens exist as single tokens, and merges learned from a small built-in text
make common words and CJK characters single tokens, as a real tokenizer would. Larger
vocabularies (129280 for DeepSeek-V4) are filled with further byte-pair merges.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import re

# llama.cpp token types (gguf TokenType)
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
CONTROL_TOKENS = (BOS, EOS, PAD)
# Matched in text as single tokens, as in DeepSeek's tokenizer (added, not special).
USER_DEFINED_TOKENS = (
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "｜DSML｜",
)
PRE_TOKENIZER = "deepseek-v3"

# What the learned merges are learned from: English, code, CJK, accents, emoji.
CORPUS = (
    "The quick brown fox jumps over the lazy dog. The model answers the question in a few words. "
    "Hello, world! Please write a function that returns the sum of two numbers. "
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
    "The weather today is sunny and warm, with a light wind from the west. "
    "Large language models run on GPUs; tokens per second depend on memory bandwidth. "
    "你好，世界！今天天气很好。我们在服务器上运行大语言模型。请用中文回答这个问题。"
    "こんにちは、世界。日本語のテキストもトークンになります。"
    "Café, naïve, résumé, Zürich, São Paulo, Ελληνικά, Русский язык. "
    "🙂🚀✨ emoji are tokens too. "
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
)
_SPLIT = re.compile(r" ?\w+| ?[^\w\s]+|\s+", re.UNICODE)


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def encode_bytes(text: str) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in text.encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int
    eos_id: int
    pad_id: int

    def __len__(self) -> int:
        return len(self.tokens)


def _learn_merges(limit: int) -> list[tuple[str, str]]:
    """Plain BPE on CORPUS, ties broken by the pair itself so the result never varies."""
    words = collections.Counter(tuple(encode_bytes(w)) for w in _SPLIT.findall(CORPUS))
    merges: list[tuple[str, str]] = []
    while len(merges) < limit:
        pairs: collections.Counter[tuple[str, str]] = collections.Counter()
        for word, n in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        merged: collections.Counter[tuple[str, ...]] = collections.Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


@functools.lru_cache(maxsize=8)
def build_vocab(size: int) -> Vocab:
    """A vocabulary of exactly ``size`` tokens (at least 512)."""
    specials = list(CONTROL_TOKENS) + list(USER_DEFINED_TOKENS)
    if size < len(specials) + 256 + 8:
        raise ValueError(f"vocabulary size {size} is too small (need >= {len(specials) + 264})")
    tokens: list[str] = list(specials)
    types = [CONTROL] * len(CONTROL_TOKENS) + [USER_DEFINED] * len(USER_DEFINED_TOKENS)
    table = byte_to_unicode()
    tokens += [table[b] for b in range(256)]
    types += [NORMAL] * 256
    seen = set(tokens)
    merges: list[str] = []

    def add(a: str, b: str) -> None:
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
            types.append(NORMAL)
            merges.append(f"{a} {b}")

    room = size - len(tokens)
    for a, b in _learn_merges(room):
        add(a, b)
    # Fill: merges of byte pairs (printable ASCII first), then of merged tokens with a byte.
    order = [table[b] for b in range(0x20, 0x7F)] + [table[b] for b in range(256) if not 0x20 <= b < 0x7F]

    def candidates():
        yield from itertools.product(order, order)
        yield from itertools.product(list(tokens[len(specials) + 256 :]), order)  # read when reached

    for a, b in candidates():
        if len(tokens) >= size:
            break
        add(a, b)
    if len(tokens) < size:
        raise ValueError(f"cannot build a {size}-token vocabulary")
    return Vocab(
        tokens=tuple(tokens[:size]),
        types=tuple(types[:size]),
        merges=tuple(merges),
        bos_id=tokens.index(BOS),
        eos_id=tokens.index(EOS),
        pad_id=tokens.index(PAD),
    )
