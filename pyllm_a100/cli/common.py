"""Shared by the command modules: the two consoles, option aliases, a table printer."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..serve.options import MODEL_HELP

out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)


JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
JsonListFlag = Annotated[bool, typer.Option("--json", help="Print a JSON list instead of text, one object per row.")]


# --ctx-size means one thing in every command: the KV pool in tokens (serve's). A context per slot has its own name;
# the old spelling of it still works, with a line saying so.
POOL_HELP = "KV cache pool in tokens, as pyllm serve --ctx-size takes it"
CtxPerSlot = Annotated[Optional[int], typer.Option("--ctx-per-slot", help="Tokens each request slot holds (prompt and reply).")]
OldCtxPerSlot = Annotated[Optional[int], typer.Option("--ctx-size", hidden=True,
                                                      help="The old spelling of --ctx-per-slot here (deprecated).")]


def per_slot_context(new: Optional[int], old: Optional[int], command: str) -> Optional[int]:
    """--ctx-per-slot, or the deprecated --ctx-size spelling of it (said once on stderr)."""
    if old is None:
        return new
    err.print(f"warning: pyllm {command} --ctx-size is now --ctx-per-slot (tokens per slot; pyllm serve's --ctx-size is "
              "the pool all slots share): the old spelling still works for now", highlight=False)
    return old if new is None else new


def aligned(header: list[str], rows: list[list[str]], right: frozenset[int] = frozenset()) -> list[str]:
    """Lines of a plain table whose columns are as wide as their longest cell (the last one unpadded)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells[:-1], widths))]
        return "  ".join(parts + [cells[-1]]).rstrip()

    return [line(header), *(line(r) for r in rows)]


def print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """A plain rich table on stdout (wide enough not to wrap when piped)."""
    from rich import box
    from rich.table import Table

    print(title)
    table = Table(*columns, box=box.SIMPLE)
    for c in table.columns[1:]:
        c.justify = "right"
    for row in rows:
        table.add_row(*row)
    (out if sys.stdout.isatty() else Console(highlight=False, width=200)).print(table)
