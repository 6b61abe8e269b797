"""Options defined once, as fields of a frozen dataclass: `pyllm serve` (ServeOptions) and `pyllm rpc-worker`
(WorkerOptions) are generated from theirs (cli/generated.py).

Each field carries its help, its environment variable (``PYLLM_PORT``, ``PYLLM_WORKER_PORT``: as llama.cpp's own
flags have ``LLAMA_ARG_*``, so containers and units can set them) and whether it is a secret. The restart rule
both commands share lives here too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

RESTART_HELP = "Restarts after a crash (default: 3 detached, 0 in the foreground)."
DETACHED_RESTARTS = 3


def option(default: Any, help: str, *, envvar: str | None = None, secret: bool = False,
           not_in_unit: str | None = None) -> Any:
    """A command-line option: ``help`` for --help; ``envvar`` replaces the generated PREFIX_NAME variable; ``secret``
    never reaches state files, `ps` or a unit's command line; ``not_in_unit`` is the one-line reason `pyllm service
    install` refuses the option."""
    return dataclasses.field(default=default, metadata={"help": help, "envvar": envvar, "secret": secret,
                                                        "not_in_unit": not_in_unit})


def argument(help: str) -> Any:
    """The command's positional argument (no default)."""
    return dataclasses.field(metadata={"help": help, "argument": True})


def internal(default: Any = None) -> Any:
    """A field the library sets and no command line has."""
    return dataclasses.field(default=default, metadata={"internal": True})


def restart_limit(restart: int | None, detach: bool) -> int:
    """--restart, or its default: 3 for a detached process, 0 in the foreground."""
    return restart if restart is not None else (DETACHED_RESTARTS if detach else 0)


class CommandOptions:
    """What the option dataclasses share: their command-line fields, environment variables and public view."""

    ENV_PREFIX: ClassVar[str] = "PYLLM_"

    @classmethod
    def cli_fields(cls) -> list[dataclasses.Field]:
        """The fields the command has as an argument or an option, in --help order."""
        return [f for f in dataclasses.fields(cls) if f.metadata.get("help")]  # type: ignore[arg-type]

    @classmethod
    def envvar(cls, f: dataclasses.Field) -> str:
        """The environment variable that sets ``f``: its own, else PREFIX + the field's name in capitals."""
        return f.metadata.get("envvar") or cls.ENV_PREFIX + f.name.upper()

    @property
    def restarts(self) -> int:
        """--restart, or its default (3 detached, 0 in the foreground)."""
        return restart_limit(getattr(self, "restart"), getattr(self, "detach"))

    def public(self) -> dict[str, Any]:
        """The options as asked, JSON-ready, without a secret (`pyllm ps --json`, request.json)."""
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.metadata.get("secret"):
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def cli_args(self) -> list[str]:
        """Options for the values that differ from the defaults (a systemd unit's command line);
        an option a unit may not carry is refused in one line. MODEL and the arguments after -- are the caller's."""
        from .errors import InvalidArgument

        out: list[str] = []
        for f in self.cli_fields():
            value = getattr(self, f.name)
            if f.metadata.get("argument") or f.metadata.get("secret") or value is None or value == f.default:
                continue
            if f.metadata.get("not_in_unit"):
                raise InvalidArgument(f.metadata["not_in_unit"])
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag if value else "--no-" + flag[2:])
            else:
                out += [flag, str(value)]
        return out
