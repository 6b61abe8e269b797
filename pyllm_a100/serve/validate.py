"""Checks of a serve request, one clear error per mistake.

:func:`check` looks at the options alone, before any file or the machine is looked at, and returns what it parsed
(the tensor split, the --gpus list, the RPC endpoints, the user's flags after --) so that nothing is parsed twice,
with the request's paths made absolute (a detached supervisor runs with cwd ``/`` and must find the same files);
the checks that need the model or the machine are resolution's (placement.py, sizing.py). A mistake
is a :class:`ServerConfigError` (exit 78 from `pyllm serve`: systemd does not restart a unit that cannot start).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from . import llama_flags
from ..errors import InvalidArgument, ServerConfigError
from ..devices.gpus import parse_gpu_list
from ..devices.splits import parse_tensor_split
from ..process.net import host_problem, is_loopback
from ..rpc.protocol import Endpoint, parse_endpoints
from .options import ServeOptions

SPLIT_MODES = ("layer", "tensor", "none")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a server's name (state.py: its folder's)


@dataclasses.dataclass(frozen=True)
class Parsed:
    """The request with its paths made absolute and no secret in it (``request``), and what its options say once
    parsed: the split's weights, the GPUs --gpus names, the workers, the user's flags after --."""

    request: ServeOptions
    tensor_split: tuple[float, ...] | None
    gpus: tuple[int, ...] | None
    rpc: tuple[Endpoint, ...]
    flags: llama_flags.UserFlags
    sized_by_user: frozenset[str]  # what the user's flags size ("ctx", "slots", "pool"): theirs, so no pool is planned


def check(options: ServeOptions, *, require_api_key: bool) -> Parsed:
    """The options alone; returns them parsed. A blank --rpc is refused (an unset $WORKERS), not read as "none"."""
    o = options
    if o.name is not None:
        check_name(o.name)
    if o.restarts < 0:
        raise InvalidArgument(f"--restart {o.restart}: must be 0 (never restart) or a number of restarts (default: 3 detached)")
    if o.api_key is not None:
        check_api_key(o.api_key)
    if o.ctx_size is not None and o.ctx_size < 1:
        raise ServerConfigError(f"--ctx-size {o.ctx_size}: must be a positive number of tokens (e.g. 8192)")
    if o.parallel is not None and o.parallel < 1:
        raise ServerConfigError(f"--parallel {o.parallel}: must be at least 1")
    if o.queue_timeout is not None and not o.queue_timeout >= 0:
        raise ServerConfigError(f"--queue-timeout {o.queue_timeout}: give the seconds a request may wait for room in the "
                                "KV pool (0: as long as it takes)")
    if o.n_gpu_layers is not None and o.n_gpu_layers < -1:
        raise ServerConfigError(f"--n-gpu-layers {o.n_gpu_layers}: give 0 (CPU only), a number of layers (999 = all) "
                                "or -1 (llama.cpp decides); leave it out for all layers when a GPU is visible")
    if o.split_mode == "row":
        raise ServerConfigError("--split-mode row: the pinned llama.cpp's CUDA backend has no row-split buffers "
                                "(llama-server fails with 'does not support split buffers'): use layer (the default) or tensor")
    if o.split_mode is not None and o.split_mode not in SPLIT_MODES:
        raise ServerConfigError(f"--split-mode {o.split_mode}: choose one of {', '.join(SPLIT_MODES)}")
    if o.port is not None and o.port != 0 and not 1 <= o.port <= 65535:
        raise ServerConfigError(f"--port {o.port}: must be between 1 and 65535 (0: any free port)")
    key_file = os.path.abspath(os.path.expanduser(o.api_key_file)) if o.api_key_file is not None else None
    if key_file is not None:
        check_key_file(Path(key_file))
    if o.alias is not None and not o.alias.strip():
        raise ServerConfigError(f"--alias {o.alias!r}: give the model name clients will send (e.g. deepseek-v4-flash), or leave "
                                "it out for the file's name")
    if o.cors_origins is not None and not o.cors_origins.strip():
        raise ServerConfigError(f"--cors-origins {o.cors_origins!r}: give the origins to allow (e.g. https://chat.example.lan, "
                                "or '*'), or leave it out for the server's own origin")
    if o.decode_latency_target is not None and not 0 <= o.decode_latency_target <= 60000:
        raise ServerConfigError(f"--decode-latency-target {o.decode_latency_target}: give milliseconds from 0 (off: "
                                "llama.cpp's own scheduling) to 60000, e.g. 100")
    if o.prefill_min_chunk is not None and not 1 <= o.prefill_min_chunk <= 1048576:
        raise ServerConfigError(f"--prefill-min-chunk {o.prefill_min_chunk}: give a number of tokens from 1 to 1048576, "
                                "e.g. 64")
    if o.batch_size is not None and o.batch_size < 1:
        raise ServerConfigError(f"--batch-size {o.batch_size}: give the prompt tokens a step may take, at least 1 "
                                "(e.g. 512)")
    if o.draft_max is not None and o.draft is None:
        raise ServerConfigError(f"--draft-max {o.draft_max} needs a draft: add --draft PATH (or --draft auto)")
    # then what other modules parse, each once: the address, the split, --gpus, the workers, the flags after --
    problem = host_problem(o.host)
    if problem:
        raise ServerConfigError(f"--host {o.host!r} is {problem}: use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) "
                                "or one of this machine's addresses (ip addr)")
    if require_api_key and not is_loopback(o.host) and key_file is None:
        raise ServerConfigError(f"--host {o.host} is reachable from the network: give an API key (Server(api_key=...) or pyllm serve generates one)")
    split = tuple(parse_tensor_split(o.tensor_split)) if o.tensor_split is not None else None
    gpus = tuple(parse_gpu_list(o.gpus) if isinstance(o.gpus, str) else o.gpus) if o.gpus is not None else None
    rpc: tuple[Endpoint, ...] = ()
    if o.rpc is not None:
        rpc = tuple(parse_endpoints(o.rpc) if isinstance(o.rpc, str) else o.rpc)
    flags = llama_flags.read(o.extra_args, o.split_mode)
    request = dataclasses.replace(o, api_key=None, api_key_file=key_file,
                                  extra_args=tuple(llama_flags.absolute_paths(o.extra_args)))
    return Parsed(request, split, gpus, rpc, flags, flags.given(llama_flags.SIZING))


def check_name(name: str) -> str:
    """A ``--name`` given by the user, refused (exit 78) unless it is kept as given: pyllm stop/logs/metrics
    find a server by that exact name (a name cleaned to another, 'has space' -> 'has-space', was not found)."""
    if not NAME.fullmatch(name):
        raise ServerConfigError(f"--name {name!r}: use letters, digits, '.', '_' or '-', starting with a letter or digit, "
                                "up to 64 (pyllm ps, stop and logs take the name as given)")
    return name


def check_server_binary(path: str | os.PathLike[str]) -> Path:
    """Another llama-server to run (a benchmark's baseline): an executable file."""
    found = Path(path).expanduser()
    if not found.is_file() or not os.access(found, os.X_OK):
        raise ServerConfigError(f"llama-server binary {os.fspath(path)!r} is not an executable file: give the path of a built "
                                "llama-server (e.g. build/bin/llama-server)")
    return found


def check_api_key(key: str) -> str:
    """A key llama-server will really enforce: not empty, no spaces or line breaks, not a '#' comment."""
    if not key.strip():
        raise ServerConfigError("--api-key is empty or only spaces, which would leave the server open: give a real key, "
                                "or leave --api-key out (a key is generated for non-loopback hosts)")
    if any(ch.isspace() for ch in key) or key.startswith("#"):
        raise ServerConfigError("--api-key must not contain spaces or line breaks, nor start with '#' (llama-server reads "
                                "its key file line by line, '#' lines as comments): use e.g. the generated one")
    return key


def check_key_file(path: Path) -> Path:
    """An --api-key-file that holds at least one usable key and no blank one (llama-server's rules)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ServerConfigError(f"API key file {path} cannot be read ({exc.strerror}): give a readable file with one key per line") from exc
    keys = [line for line in lines if line and not line.startswith("#")]
    if not keys or any(not k.strip() for k in keys):
        raise ServerConfigError(f"API key file {path} has no usable key (empty or blank lines only): put one key per line in it")
    return path
