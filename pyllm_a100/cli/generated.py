"""Commands generated from an options dataclass (command_options.py): `pyllm serve` from ServeOptions, `pyllm
rpc-worker` from WorkerOptions. Each field becomes one parameter with its type, help, environment variable and
default, so the command, the library and a unit never disagree."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer


def parameter_info(cls: Any, name: str) -> Any:
    """The typer Argument or Option of one field (its help and environment variable)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.metadata.get("argument"):
        return typer.Argument(help=f.metadata["help"], envvar=cls.envvar(f))
    return typer.Option(help=f.metadata["help"], envvar=cls.envvar(f))


def annotation(cls: Any, name: str) -> Any:
    """``Annotated[type, typer info]`` of one field: how another command declares the same option (one definition)."""
    kind = typing.get_type_hints(cls)[name]
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    if len(inner) == 1 and type(None) in typing.get_args(kind):
        kind = Optional[inner[0]]
    return Annotated[kind, parameter_info(cls, name)]


def command_from(cls: Any, run: Callable[..., None], name: str, *, takes_context: bool = False) -> Callable[..., None]:
    """A typer command whose parameters are ``cls``'s command-line fields; ``run`` gets them as keywords (and the
    click context first when ``takes_context``: the arguments after ``--``)."""
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)] \
        if takes_context else []
    for f in cls.cli_fields():
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        params.append(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                        annotation=annotation(cls, f.name)))

    def command(*args: Any, **values: Any) -> None:
        run(*args, **values)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = run.__doc__
    command.__name__ = name.replace("-", "_")
    return command
