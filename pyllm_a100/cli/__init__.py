"""The `pyllm` command: a thin typer layer over the library. app (the commands, one main()), one module per
command group (serve: serve, rpc-worker, ps, stop, logs, metrics; bench; doctor; generate; models; systemd: pyllm
service; vendor), generated (commands made from an options dataclass) and common (consoles, option aliases)."""

from __future__ import annotations

from .app import app, main

__all__ = ["app", "main"]
