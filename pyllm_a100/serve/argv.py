"""llama-server's command line, from a resolved :class:`~pyllm_a100.serve.config.ServerConfig`.

The user's own llama-server flags after ``--`` come last and as given; a flag of theirs that sizes the pool or sets
a scheduling option (llama_flags.py's table) takes that job from serve, which then does not pass its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..devices.splits import to_llama_arg
from . import llama_flags
from .llama_flags import SCHEDULING
from .options import DEFAULT_PARALLEL

ServerConfig = Any  # config.ServerConfig, which imports this module (its to_argv)


def server_argv(config: ServerConfig, server_binary: str | os.PathLike[str], api_key_file: Path | None = None) -> list[str]:
    """The whole command line; ``api_key_file`` is the key llama-server enforces (never the key itself)."""
    argv = [
        str(server_binary),
        "--model", str(config.model.first),
        "--host", config.host,
        "--port", str(config.port),
        "--alias", config.served_name,
        "--cors-origins", config.cors_allowed,
    ]
    if config.n_gpu_layers is not None:
        argv += ["--n-gpu-layers", str(config.n_gpu_layers)]
    if config.tensor_split is not None:
        argv += ["--tensor-split", to_llama_arg(list(config.tensor_split))]
    if config.split_mode is not None:
        argv += ["--split-mode", config.split_mode]
    if config.flags.value("split_mode") == "tensor":
        argv += tensor_defaults(config.flags)
    argv += sizing(config)
    argv += scheduling(config)
    if config.queue_timeout is not None:
        argv += ["--queue-timeout", str(config.queue_timeout)]
    if api_key_file is not None:
        argv += ["--api-key-file", str(api_key_file)]
    if config.rpc:
        argv += ["--rpc", ",".join(map(str, config.rpc))]
    if config.draft is not None:
        argv += config.draft.argv()
    if config.metrics:
        argv.append("--metrics")
    return argv + list(config.extra_args)


def tensor_defaults(flags: llama_flags.UserFlags) -> list[str]:
    """What --split-mode tensor needs unless the user's flags already say it: flash attention on, --fit off."""
    out: list[str] = []
    if flags.value("flash_attn") is None:
        out += ["--flash-attn", "on"]
    if flags.value("fit") is None:
        out += ["--fit", "off"]
    return out


def sizing(config: ServerConfig) -> list[str]:
    """The KV pool and slots: the plan's; else the caller's exact sizing (--parallel with options.kv_unified) or the
    fixed defaults, leaving out what the user's own flags after -- already size."""
    options = config.options
    if config.capacity is not None:
        return config.capacity.argv()
    given = config.sized_by_user
    argv = [] if "ctx" in given else ["--ctx-size", str(config.effective_ctx)]
    if options.parallel is not None:
        argv += ["--parallel", str(options.parallel)] + (["--kv-unified"] if options.kv_unified else [])
    elif DEFAULT_PARALLEL is not None and "slots" not in given:
        argv += ["--parallel", str(DEFAULT_PARALLEL)] + ([] if given else ["--kv-unified"])
    return argv


def scheduling(config: ServerConfig) -> list[str]:
    """How steps share prompt and decode tokens, in the flags' long spelling (--batch-size, not -b); an option the
    user's flags after -- set is theirs and not passed twice. None: llama-server's own (e.g. for another binary)."""
    theirs = config.flags.given(SCHEDULING)
    values = config.scheduling_values()
    argv: list[str] = []
    for key in llama_flags.keys(SCHEDULING):
        value = values[key]
        if value is not None and key not in theirs:
            argv += [llama_flags.long_name(key), str(value)]
    return argv
