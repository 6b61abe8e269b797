"""JSON as lab/results keeps it: a row a line, readable and diffable at a tenth of indent=2's lines.

The top level's members each open on a line of their own, and so do theirs; one level further opens only where a value
holds rows (a list of objects); anything deeper, a list of plain values, and anything that fits in 120 characters stays
on one line. ``json.loads(dumps(x)) == x`` always.
"""

from __future__ import annotations

import json
from typing import Any

WIDTH = 120


def _holds_rows(v: Any) -> bool:
    if isinstance(v, list):
        return any(isinstance(x, dict) or (isinstance(x, list) and any(isinstance(y, (dict, list)) for y in x)) or _holds_rows(x)
                   for x in v)
    return isinstance(v, dict) and any(_holds_rows(x) for x in v.values())


def _fmt(v: Any, depth: int) -> str:
    flat = json.dumps(v)
    if (not isinstance(v, (dict, list)) or not v or len(flat) + depth <= WIDTH
            or (isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v))
            or (depth >= 2 and not (depth == 2 and _holds_rows(v)))):
        return flat
    pad = " " * (depth + 1)
    items = [f"{json.dumps(k)}: {_fmt(x, depth + 1)}" for k, x in v.items()] if isinstance(v, dict) else [
        _fmt(x, depth + 1) for x in v]
    o, c = "{}" if isinstance(v, dict) else "[]"
    return o + "\n" + ",\n".join(pad + i for i in items) + "\n" + " " * depth + c


def dumps(value: Any) -> str:
    """``value`` as JSON, one row a line, with a final newline."""
    return _fmt(value, 0) + "\n"
