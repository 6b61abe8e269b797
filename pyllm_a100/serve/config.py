"""A serve request resolved once: :class:`ServerConfig`, frozen.

resolve.py makes it (:func:`resolve.resolve`), and nothing changes it afterwards: the CLI prints it, a detached
supervisor runs it as request.json holds it (persist.py: nothing resolved again), `pyllm ps` shows it and
argv.py turns it into llama-server's command line. What was asked stays in ``options``; what it resolved to is in
the other fields; everything else here is derived from those two.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Any

from ..models.gguf_files import ModelFiles
from ..planning.capacity import Capacity
from ..process.net import is_loopback
from ..rpc.devices import Device
from ..rpc.protocol import Endpoint
from .llama_flags import ALL_LAYERS, SCHEDULING, SIZING, UserFlags
from .llama_flags import read as read_flags
from .options import DEFAULT_BATCH_SIZE, DEFAULT_PREFILL_LANE, DEFAULT_PREFILL_MIN_CHUNK, ServeOptions

DEFAULT_CTX = 16384  # the pool when no memory plan is made (the weights alone do not fit: llama.cpp's --fit decides)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """What was asked (``options``) and what it resolved to; :meth:`to_argv` is llama-server's command line."""

    options: ServeOptions
    model: ModelFiles
    port: int | None = None  # None: the port asked (options.port)
    n_gpu_layers: int | None = None  # None: llama.cpp's own (CPU); ALL_LAYERS when GPUs or RPC devices hold them
    tensor_split: tuple[float, ...] | None = None
    rpc: tuple[Endpoint, ...] = dataclasses.field(default_factory=tuple)
    devices: tuple[Device, ...] = dataclasses.field(default_factory=tuple)  # the model's devices in llama.cpp's order: the workers', then local GPUs
    draft: Any = None  # models.drafts.Draft: speculative decoding (--spec-draft-model, --spec-type, --spec-draft-n-max)
    capacity: Capacity | None = None  # the planned pool and slots (None: sized by the caller, or not planned)
    flags: UserFlags | None = None  # the user's llama-server flags after --, read once (None: read them here)

    def __post_init__(self) -> None:
        if self.port is None:
            object.__setattr__(self, "port", self.options.port)
        if self.flags is None:
            object.__setattr__(self, "flags", read_flags(self.options.extra_args, self.options.split_mode))

    # -- what was asked, read through (one definition: ServeOptions)

    @property
    def host(self) -> str:
        return self.options.host

    @property
    def split_mode(self) -> str | None:
        return self.options.split_mode

    @property
    def extra_args(self) -> tuple[str, ...]:
        return self.options.extra_args

    @property
    def metrics(self) -> bool:
        return self.options.metrics

    @property
    def queue_timeout(self) -> int | None:
        return self.options.queue_timeout

    @property
    def api_key_file(self) -> Path | None:
        """The key file the request named (Server(api_key=...) writes one); a launch may add its own (launch.Launch)."""
        return Path(self.options.api_key_file) if self.options.api_key_file else None

    @property
    def gpus(self) -> tuple[int, ...] | None:
        """--gpus as resolved: the nvidia-smi numbers of the GPUs chosen (the child sees only these), None without it."""
        if self.options.gpus is None:
            return None
        return tuple(d.gpu for d in self.devices if d.gpu is not None)

    @property
    def gpus_used(self) -> list[int]:
        """nvidia-smi numbers of the GPUs this server may use: those holding layers (none on the CPU)."""
        return [d.gpu for d in self.devices if d.gpu is not None] if self.n_gpu_layers else []

    # -- derived

    @property
    def served_name(self) -> str:
        return self.options.alias or self.model.name

    @property
    def offload(self) -> str:
        """The layers on GPUs (or RPC devices) as `pyllm serve` says it: "all", a number, or "CPU"."""
        if not self.n_gpu_layers:
            return "CPU"
        return "all" if self.n_gpu_layers >= ALL_LAYERS else str(self.n_gpu_layers)

    @property
    def effective_ctx(self) -> int:
        if self.capacity is not None:
            return self.capacity.pool
        if self.options.ctx_size is not None:
            return self.options.ctx_size
        trained = self.model.metadata.get(f"{self.model.architecture}.context_length")
        return min(int(trained), DEFAULT_CTX) if trained else DEFAULT_CTX

    @property
    def cors_allowed(self) -> str:
        """--cors-origins by default: cross-origin pages allowed are the loopback ones for a loopback
        bind (llama-server's ``localhost`` mode reflects http://127.0.0.1, localhost and [::1] origins),
        else the address users are told to use (``http://HOSTNAME:PORT`` for a wildcard bind, never
        ``http://0.0.0.0:PORT``). llama-server sends one Access-Control-Allow-Origin value as given, so
        one rule per bind; pages served by the server itself are same-origin and need none."""
        if self.options.cors_origins:
            return self.options.cors_origins
        return "localhost" if is_loopback(self.host) else self.public_url

    @property
    def public_url(self) -> str:
        """What clients on other machines type: the host name when bound to all interfaces."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str] | None:
        """llama-server's environment: a copy of ``base`` (os.environ) with CUDA_VISIBLE_DEVICES for --gpus;
        None (inherit unchanged) without --gpus. os.environ itself is never changed."""
        if self.gpus is None:
            return None if base is None else dict(base)
        from ..devices.gpus import child_env

        return child_env(self.gpus, base)

    @property
    def scheduling(self) -> str:
        """The co-tenancy choice in words (pyllm serve and doctor print it)."""
        o = self.options
        given = self.flags.as_typed(SCHEDULING)
        if given:
            return f"as the llama-server flags after -- set it ({', '.join(given)}; pyllm's defaults for the rest)"
        step = f"prompt steps of at most {o.batch_size} tokens" if o.batch_size else "llama-server's prompt steps"
        lane = (f"; prompts of {self.lane_threshold:,}+ new tokens are prefilled in a lane beside the decoding streams "
                "(--prefill-lane; 0: off)" if self.lane_threshold else "")
        if not o.decode_latency_target:
            return f"{step}; no decode latency target (a long prompt stalls decoding streams){lane}"
        return (f"decoding streams keep a token every {o.decode_latency_target} ms on average while prompts are "
                f"prefilled (--decode-latency-target; 0: off), {step}{lane}")

    @property
    def lane_threshold(self) -> int:
        """The prefill lane's --prefill-lane as resolved (0: off): as asked (the option, or the user's flag after --);
        by default on where the plan made room for it (GPUs hold the layers: sizing.plan), off elsewhere."""
        from .sizing import explicit_lane

        asked = explicit_lane(self.options, self.flags)
        if asked is not None:
            return asked
        return DEFAULT_PREFILL_LANE if self.capacity is not None and self.capacity.lane else 0

    @property
    def min_chunk(self) -> int | None:
        """--prefill-min-chunk as resolved: the option, else 64 where GPUs hold the layers and a full batch on the CPU,
        where a small chunk deep in a prompt runs at about half speed (SmolLM2, 2 cores, depth 3,000: 65 tokens/s in
        64-token steps, 116 in 512-token ones), so the prefill took 1.67x llama.cpp's scheduling instead of 1.25x."""
        from .sizing import on_gpus

        o = self.options
        if o.prefill_min_chunk is not None or not o.decode_latency_target:
            return o.prefill_min_chunk  # without a target the floor means nothing: llama-server's own scheduling
        if on_gpus(self.devices, self.n_gpu_layers):
            return DEFAULT_PREFILL_MIN_CHUNK
        theirs = self.flags.value("batch_size")  # the user's -b after --: the floor is their batch
        if theirs and theirs.isdigit() and int(theirs) > 0:
            return int(theirs)
        return o.batch_size or DEFAULT_BATCH_SIZE  # a bad -b is llama-server's to refuse, not the floor's

    def scheduling_values(self) -> dict[str, int | None]:
        """serve's scheduling options as llama-server gets them (the lane's and the floor's as resolved; None: not
        passed)."""
        o = self.options
        return {"batch_size": o.batch_size, "decode_latency_target": o.decode_latency_target,
                "prefill_min_chunk": self.min_chunk,
                "prefill_lane": self.lane_threshold or None}  # off is llama-server's own default: not passed

    @property
    def sized_by_user(self) -> frozenset[str]:
        """What the user's own flags after -- size ("ctx", "slots", "pool"): theirs, so serve plans no pool."""
        return self.flags.given(SIZING)

    def device_plan(self) -> list[dict[str, Any]]:
        """Each device llama.cpp will use with the layers, weights and KV the plan gives it (`pyllm ps`)."""
        out = [{k: v for k, v in dataclasses.asdict(d).items() if k != "gpu"} for d in self.devices]
        if not out or self.capacity is None or not self.n_gpu_layers or self.n_gpu_layers < ALL_LAYERS:
            return out
        from ..planning.memplan import local_shape, per_device

        per, streams = self.capacity.streams
        split = list(self.tensor_split) if self.tensor_split is not None else None
        plans = per_device(local_shape(self.model), len(out), per, streams, split=split, lane=self.capacity.lane)
        for entry, plan in zip(out, plans):
            entry.update(layers=plan.layers, weights_bytes=plan.weights, kv_bytes=plan.kv)
        return out

    def to_argv(self, server_binary: str | os.PathLike[str], api_key_file: Path | None = None) -> list[str]:
        """llama-server's command line (argv.py); ``api_key_file``: the launch's key file, if not the request's."""
        from .argv import server_argv

        return server_argv(self, server_binary, api_key_file or self.api_key_file)
