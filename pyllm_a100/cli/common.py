"""Shared by the command modules: the two consoles, option aliases, a table printer."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


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
