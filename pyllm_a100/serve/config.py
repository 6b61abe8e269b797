"""A serve request resolved once: :func:`make_config` turns :class:`ServeOptions` into a :class:`ServerConfig`.

Resolution happens here and nowhere else: the model files, the port (0: a free one), the GPUs (--gpus, checked
against NVML and the build), the RPC workers (each must answer) and the devices llama.cpp will see (listed once,
in the environment the server will run in), the draft, the layers to offload and the KV pool's plan. The result
is what `pyllm serve` prints, what a detached supervisor runs (:meth:`ServerConfig.to_json` /
:meth:`ServerConfig.from_json`, nothing resolved again) and what :meth:`ServerConfig.to_argv` turns into
llama-server's command line. The options themselves (names, types, defaults, help) live in options.py only.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import tensor_mode
from ..errors import GpuSelectionError, PortInUse, ServerConfigError
from ..llamacpp.native import build_info
from ..models.capacity import DEFAULT_SLOTS, Budget, Capacity
from ..models.gguf_files import ModelFiles, resolve_model
from ..devices.splits import check_against_devices, parse_tensor_split, to_llama_arg
from .net import bind_refusal, free_port, host_problem, is_loopback
from .options import LLAMA_SCHEDULING_FLAGS, ServeOptions
from .rpc import Device, Endpoint

log = logging.getLogger(__name__)

DEFAULT_CTX = 16384  # the pool when no memory plan is made (the weights alone do not fit: llama.cpp's --fit decides)
MIB = 2**20
SPLIT_MODES = ("layer", "tensor", "none")
ALL_LAYERS = 999  # llama.cpp's "every layer" for --n-gpu-layers
# Request slots when --parallel is not given (models/capacity.py plans the KV pool for them). 16, measured on two
# H200s with the real-shape V4 cut to 4 layers: at 16 streams 1.22x the aggregate of llama-server's 4 slots and
# TTFT p50 0.25 s instead of 1.53 s, one stream as fast as before (docs/performance.md, "Concurrency").
DEFAULT_PARALLEL: int | None = DEFAULT_SLOTS


@dataclasses.dataclass
class ServerConfig:
    """What was asked (``options``, unchanged) and what it resolved to; :meth:`to_argv` is llama-server's command line."""

    options: ServeOptions
    model: ModelFiles
    port: int | None = None  # None: the port asked (options.port)
    n_gpu_layers: int | None = None  # None: llama.cpp's own (CPU); ALL_LAYERS when GPUs or RPC devices hold them
    tensor_split: list[float] | None = None
    rpc: list[Endpoint] = dataclasses.field(default_factory=list)
    devices: list[Device] = dataclasses.field(default_factory=list)  # the model's devices in llama.cpp's order: workers', local GPUs
    gpus: list[int] | None = None  # --gpus: nvidia-smi numbers; the child sees only these (child_env)
    gpus_used: list[int] = dataclasses.field(default_factory=list)  # nvidia-smi numbers of the GPUs it may use
    draft: Any = None  # drafts.Draft: speculative decoding (--spec-draft-model, --spec-type, --spec-draft-n-max)
    capacity: Capacity | None = None  # the planned pool and slots (None: sized by the caller, or not planned)
    api_key_file: Path | None = None  # the key llama-server enforces: options.api_key_file, or the one serve wrote

    def __post_init__(self) -> None:
        if self.port is None:
            self.port = self.options.port

    # -- what was asked, read through (one definition: ServeOptions)

    @property
    def host(self) -> str:
        return self.options.host

    @property
    def split_mode(self) -> str | None:
        return self.options.split_mode

    @property
    def extra_args(self) -> list[str]:
        return self.options.extra_args

    @property
    def metrics(self) -> bool:
        return self.options.metrics

    @property
    def queue_timeout(self) -> int | None:
        return self.options.queue_timeout

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

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str] | None:
        """llama-server's environment: a copy of ``base`` (os.environ) with CUDA_VISIBLE_DEVICES for --gpus;
        None (inherit unchanged) without --gpus. os.environ itself is never changed."""
        if self.gpus is None:
            return None if base is None else dict(base)
        from ..devices.gpus import child_env

        return child_env(self.gpus, base)

    @property
    def public_url(self) -> str:
        """What clients on other machines type: the host name when bound to all interfaces."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    def to_argv(self, server_binary: str | os.PathLike[str]) -> list[str]:
        argv = [
            str(server_binary),
            "--model", str(self.model.first),
            "--host", self.host,
            "--port", str(self.port),
            "--alias", self.served_name,
            "--cors-origins", self.cors_allowed,
        ]
        if self.n_gpu_layers is not None:
            argv += ["--n-gpu-layers", str(self.n_gpu_layers)]
        if self.tensor_split is not None:
            argv += ["--tensor-split", to_llama_arg(self.tensor_split)]
        if self.split_mode is not None:
            argv += ["--split-mode", self.split_mode]
        if (self.split_mode or tensor_mode.flag_value(self.extra_args, tensor_mode.SPLIT_MODE)) == "tensor":
            argv += tensor_mode.argv_defaults(self.extra_args)
        argv += self._sizing_argv()
        argv += self._scheduling_argv()
        if self.queue_timeout is not None:
            argv += ["--queue-timeout", str(self.queue_timeout)]
        if self.api_key_file is not None:
            argv += ["--api-key-file", str(self.api_key_file)]
        if self.rpc:
            argv += ["--rpc", ",".join(map(str, self.rpc))]
        if self.draft is not None:
            argv += self.draft.argv()
        if self.metrics:
            argv.append("--metrics")
        return argv + list(self.extra_args)

    def _sizing_argv(self) -> list[str]:
        """The KV pool and slots: the plan's; else the caller's exact sizing (--parallel with options.kv_unified) or the
        fixed defaults, leaving out what the user's own flags after -- already size."""
        options = self.options
        if self.capacity is not None:
            return self.capacity.argv()
        given = options.sized_after_dashes
        argv = [] if "ctx" in given else ["--ctx-size", str(self.effective_ctx)]
        if options.parallel is not None:
            argv += ["--parallel", str(options.parallel)] + (["--kv-unified"] if options.kv_unified else [])
        elif DEFAULT_PARALLEL is not None and "slots" not in given:
            argv += ["--parallel", str(DEFAULT_PARALLEL)] + ([] if given else ["--kv-unified"])
        return argv

    def device_plan(self) -> list[dict[str, Any]]:
        """Each device llama.cpp will use with the layers, weights and KV the plan gives it (`pyllm ps`)."""
        out = [dataclasses.asdict(d) for d in self.devices]
        if not out or self.capacity is None or not self.n_gpu_layers or self.n_gpu_layers < ALL_LAYERS:
            return out
        from ..models.memplan import local_shape, per_device

        per, streams = self.capacity.streams
        plans = per_device(local_shape(self.model), len(out), per, streams, split=self.tensor_split)
        for entry, plan in zip(out, plans):
            entry.update(layers=plan.layers, weights_bytes=plan.weights, kv_bytes=plan.kv)
        return out

    def _scheduling_argv(self) -> list[str]:
        """How steps share prompt and decode tokens (None: llama-server's own, e.g. for another binary)."""
        o = self.options
        theirs = o.scheduled_after_dashes  # the user's flags after -- win, and are not passed twice
        argv: list[str] = []
        for name, flags in LLAMA_SCHEDULING_FLAGS.items():  # passed in its long spelling (--batch-size, not -b)
            if getattr(o, name) is not None and name not in theirs:
                argv += [max(flags, key=len), str(getattr(o, name))]
        return argv

    @property
    def scheduling(self) -> str:
        """The co-tenancy choice in words (pyllm serve and doctor print it)."""
        o = self.options
        if o.scheduled_after_dashes:
            flags = set().union(*LLAMA_SCHEDULING_FLAGS.values())
            args = o.extra_args
            given = [a if "=" in a else " ".join(args[i:i + 2]) for i, a in enumerate(args) if a.partition("=")[0] in flags]
            return f"as the llama-server flags after -- set it ({', '.join(given)}; pyllm's defaults for the rest)"
        step = f"prompt steps of at most {o.batch_size} tokens" if o.batch_size else "llama-server's prompt steps"
        if not o.decode_latency_target:
            return f"{step}; no decode latency target (a long prompt stalls decoding streams)"
        return (f"decoding streams keep a token every {o.decode_latency_target} ms on average while prompts are "
                f"prefilled (--decode-latency-target; 0: off), {step}")

    # -- what a detached supervisor runs: this object, not the request resolved a second time

    def to_json(self) -> dict[str, Any]:
        """JSON of the resolved config (the options without the API key itself)."""
        options = self.options.public()
        options["model"] = str(self.model.first)  # a relative path or a hub reference, as found
        if options["rpc"] is not None and not isinstance(options["rpc"], str):
            options["rpc"] = ",".join(map(str, options["rpc"]))
        return {
            "options": options,
            "model": str(self.model.first),
            "port": self.port,
            "n_gpu_layers": self.n_gpu_layers,
            "tensor_split": self.tensor_split,
            "rpc": [str(e) for e in self.rpc],
            "devices": [dataclasses.asdict(d) for d in self.devices],
            "gpus": self.gpus,
            "gpus_used": self.gpus_used,
            "draft": None if self.draft is None else {
                "path": str(self.draft.files.first) if self.draft.files is not None else None,
                "spec_type": self.draft.spec_type, "n_max": self.draft.n_max},
            "capacity": None if self.capacity is None else dataclasses.asdict(self.capacity),
            "api_key_file": None if self.api_key_file is None else str(self.api_key_file),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerConfig:
        """The config :meth:`to_json` wrote: the model's files are read again (their headers), nothing is resolved."""
        from ..models.drafts import Draft
        from .rpc import parse_endpoints

        draft = data.get("draft")
        if draft is not None:
            files = resolve_model(draft["path"], check_arch=False) if draft["path"] else None
            draft = Draft(files, draft["spec_type"], draft["n_max"])
        capacity = data.get("capacity")
        if capacity is not None:
            budget = capacity.pop("budget")
            capacity = Capacity(**capacity, budget=Budget(tuple(budget["per_device"]), budget["gpu"], budget["rule"]))
        return cls(options=ServeOptions(**data["options"]), model=resolve_model(data["model"]), port=data["port"],
                   n_gpu_layers=data["n_gpu_layers"], tensor_split=data["tensor_split"],
                   rpc=parse_endpoints(",".join(data["rpc"])) if data["rpc"] else [],
                   devices=[Device(**d) for d in data["devices"]], gpus=data["gpus"], gpus_used=data["gpus_used"],
                   draft=draft, capacity=capacity,
                   api_key_file=Path(data["api_key_file"]) if data["api_key_file"] else None)


def select_gpus(text: str | Sequence[int]) -> list[int]:
    """--gpus checked against this machine (NVML) and this build (CUDA); nvidia-smi's numbers."""
    from ..devices import gpus as devices

    chosen = [g.physical_index for g in devices.select_gpus(text, devices.nvml_gpus())]
    if not build_info().get("cuda"):
        raise GpuSelectionError(f"--gpus {devices.format_gpu_list(chosen)}: this llama.cpp build has no CUDA (CPU only), "
                                "so llama-server cannot use a GPU: reinstall with CUDA (see README), or leave --gpus out")
    return chosen


def _check_arguments(options: ServeOptions, *, require_api_key: bool) -> None:
    """The options alone, before any file or the machine is looked at (one clear error per mistake)."""
    o = options
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
    problem = host_problem(o.host)
    if problem:
        raise ServerConfigError(f"--host {o.host!r} is {problem}: use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) "
                                "or one of this machine's addresses (ip addr)")
    if o.tensor_split is not None:
        parse_tensor_split(o.tensor_split)
    if isinstance(o.gpus, str):
        from ..devices.gpus import parse_gpu_list

        parse_gpu_list(o.gpus)  # syntax first; the machine is asked later
    if o.api_key_file is not None:
        check_key_file(Path(o.api_key_file))
    if require_api_key and not is_loopback(o.host) and o.api_key_file is None:
        raise ServerConfigError(f"--host {o.host} is reachable from the network: give an API key (Server(api_key=...) or pyllm serve generates one)")
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


def make_config(options: ServeOptions, *, require_api_key: bool = True) -> ServerConfig:
    """Validate every input before anything starts and resolve the request; raise one clear error per mistake.

    Order: the arguments themselves, then the model files, then the machine (GPUs, RPC workers, the port):
    a bad argument is reported as such even when, say, the port is busy.
    """
    _check_arguments(options, require_api_key=require_api_key)
    endpoints: list[Endpoint] = []
    if options.rpc is not None:  # a blank --rpc is refused (an unset $WORKERS), not read as "no workers"
        from .rpc import parse_endpoints

        endpoints = parse_endpoints(options.rpc) if isinstance(options.rpc, str) else list(options.rpc)
    # the model files
    files = options.model if isinstance(options.model, ModelFiles) else resolve_model(options.model)
    from ..models.drafts import refuse_as_model

    refuse_as_model(files)
    draft = None
    if options.draft is not None:
        from ..models.drafts import resolve as resolve_draft

        draft = resolve_draft(files, options.draft, options.draft_max).with_default_max()
    # the machine: RPC workers, devices, then the address
    port = options.port
    if port is None or port == 0:
        port = free_port(options.host if is_loopback(options.host) else "0.0.0.0")
    if endpoints:
        from .rpc import hello

        for endpoint in endpoints:
            hello(endpoint)  # each worker must answer before llama-server is started
    selected = select_gpus(options.gpus) if options.gpus is not None else None
    visible = _visible_gpus(selected)  # NVML asked once
    usable = len(visible) if build_info().get("cuda") else 0
    devices: list[Device] = []
    if endpoints:
        # in the model's order, which --tensor-split follows: llama.cpp puts the RPC devices first ("to minimize
        # network transfers", src/llama.cpp), then the local GPUs; --list-devices prints the registry's order
        listed = _list_devices(endpoints, selected)
        devices = [d for d in listed if d.name.startswith("RPC")] + [d for d in listed if not d.name.startswith("RPC")]
    elif usable:
        devices = [Device(f"CUDA{i}", g.name, g.memory_total // MIB, g.memory_free // MIB) for i, g in enumerate(visible)]
    if (options.split_mode or tensor_mode.flag_value(options.extra_args, tensor_mode.SPLIT_MODE)) == "tensor":
        tensor_mode.check(files.architecture, options.extra_args, usable + len(endpoints))
    parts = parse_tensor_split(options.tensor_split) if options.tensor_split is not None else None
    if parts is not None:
        if endpoints:  # local GPUs and the workers' devices together, as llama.cpp counts them
            check_against_devices(parts, len(devices), text=str(options.tensor_split), gpus=selected,
                                  found=[_device_label(d, visible) for d in devices])
        else:
            check_against_devices(parts, len(visible), text=str(options.tensor_split), gpus=selected)
    refused = bind_refusal(options.host, port)  # last: a busy port never hides a mistake found above
    if refused:
        in_use, reason = refused
        if in_use:
            raise PortInUse(f"{reason}: pass another --port, or stop that server (pyllm ps / pyllm stop)")
        raise ServerConfigError(reason)
    n_gpu_layers = options.n_gpu_layers
    if n_gpu_layers is None:
        n_gpu_layers = ALL_LAYERS if endpoints or usable else None  # all layers on the GPUs (remote devices hold layers too)
    gpus_used = list(selected) if selected is not None else [g.physical_index for g in visible] if n_gpu_layers and usable else []
    capacity = None
    if options.kv_unified is None and not options.sized_after_dashes:
        if not endpoints:
            capacity = plan_capacity(files, options, _local_budget(files, options, visible if usable else [], n_gpu_layers),
                                     split=parts)
        elif n_gpu_layers >= ALL_LAYERS:  # every device reports its own memory: local GPUs and workers' alike
            capacity = plan_capacity(files, options, Budget.gpus([d.total_mib * MIB for d in devices],
                                                                 [(d.total_mib - d.free_mib) * MIB for d in devices]),
                                     split=parts)
    return ServerConfig(options=options, model=files, port=port, n_gpu_layers=n_gpu_layers, tensor_split=parts,
                        rpc=endpoints, devices=devices, gpus=selected, gpus_used=gpus_used, draft=draft, capacity=capacity,
                        api_key_file=Path(options.api_key_file) if options.api_key_file else None)


def _visible_gpus(selected: list[int] | None) -> list[Any]:
    """The GPUs NVML shows this process (what --tensor-split counts), only those --gpus chose when given."""
    from ..devices.gpus import visible_gpus

    present = visible_gpus()
    return present if selected is None else [g for g in present if g.physical_index in selected]


def _list_devices(endpoints: list[Endpoint], selected: list[int] | None) -> list[Device]:
    """llama.cpp's devices (the registry's order: local GPUs, then the workers'), listed in the environment
    llama-server will run in."""
    from ..devices.gpus import child_env
    from .rpc import list_devices

    return list_devices(endpoints, env=child_env(selected) if selected is not None else None)


def _device_label(device: Device, visible: Sequence[Any]) -> str:
    """``CUDA0 (GPU 2)`` for a local GPU by nvidia-smi's number, ``RPC1 (worker 10.0.0.2:50052)`` for a worker's."""
    if device.name.startswith("RPC"):
        return f"{device.name} (worker {device.description})"
    index = device.name.removeprefix("CUDA")
    if index.isdigit() and int(index) < len(visible):
        return f"{device.name} (GPU {visible[int(index)].physical_index})"
    return device.name


def _local_budget(files: ModelFiles, options: ServeOptions, gpus: Sequence[Any], n_gpu_layers: int | None) -> Budget:
    """This machine's memory for the KV pool: the GPUs' when every layer is offloaded to them, else RAM."""
    from ..models.memplan import local_shape

    shape = local_shape(files)
    if gpus and n_gpu_layers is not None and n_gpu_layers >= shape.n_layer + 1:
        return Budget.gpus([g.memory_total for g in gpus], [g.memory_total - g.memory_free for g in gpus])
    import psutil

    # the default pool takes a share of RAM; a pool the user asks for only has to fit what is available
    return Budget.cpu(psutil.virtual_memory().available, whole=options.ctx_size is not None)


def plan_capacity(files: ModelFiles, options: ServeOptions, budget: Budget, *, split: list[float] | None) -> Capacity | None:
    """The KV pool and slots for this model within ``budget`` (models/capacity.py). A --ctx-size or --parallel that
    cannot fit is refused, naming the largest pool that does; when not even the default plan fits (the weights
    alone), None: llama.cpp's --fit decides, as before."""
    from ..models import capacity
    from ..models.memplan import local_shape

    ctx_size, parallel = options.ctx_size, options.parallel
    plan = capacity.plan(local_shape(files), budget, slots=parallel, pool=ctx_size, split=split)
    if plan.fits:
        log.info("capacity plan: %s", plan.summary())
        return plan
    if ctx_size is None and parallel is None:
        log.warning("no KV pool fits beside the weights (%s): llama.cpp's --fit decides", budget.rule)
        return None
    asked = f"--ctx-size {ctx_size}" if ctx_size is not None else f"--parallel {parallel}"
    if plan.largest_pool:
        unit = "tokens in all" if not plan.shared else "tokens"
        raise ServerConfigError(f"{asked}: {plan.kv_bytes / 2**30:.2f} GiB of KV cache for {plan.pool} tokens does not fit "
                                f"beside the weights and compute buffers ({budget.rule}): the largest pool that fits "
                                f"{plan.slots} slots is --ctx-size {plan.largest_pool} ({unit})")
    raise ServerConfigError(f"{asked}: no KV pool for {plan.slots} slot(s) fits beside the weights and compute buffers "
                            f"({budget.rule}): use fewer --parallel, more GPUs (--tensor-split) or a smaller quantization")


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


# llama-server flags whose value is a local file or folder (the pinned common/arg.cpp's FNAME/PATH/FILE options).
PATH_FLAGS = frozenset({
    "-m", "--model", "-md", "--model-draft", "--spec-draft-model", "-mm", "--mmproj", "--lora", "--lora-scaled",
    "--control-vector", "--control-vector-scaled", "--grammar-file", "-jf", "--json-schema-file", "--chat-template-file",
    "--api-key-file", "--ssl-key-file", "--ssl-cert-file", "--slot-save-path", "--path", "--media-path", "--models-dir",
    "--models-preset", "--log-file", "--log-prompts-dir", "-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic",
    "--prompt-cache", "-sysf", "--system-prompt-file", "--ui-config-file", "--webui-config-file", "--mcp-servers-config",
    "--context-file", "--logits-output-dir",
})


def absolute_paths(args: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """``args`` with the value of every path flag made absolute (``-md d.gguf``, ``--lora=x.gguf``), so a
    supervisor running elsewhere (cwd ``/``) finds the same files."""
    base = Path(cwd or os.getcwd())

    def absolute(value: str) -> str:
        if not value:
            return value
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else base / path)

    out: list[str] = []
    expect = False
    for arg in args:
        if expect:
            out.append(absolute(arg))
            expect = False
        elif arg.startswith("-") and "=" in arg and arg.split("=", 1)[0] in PATH_FLAGS:
            flag, value = arg.split("=", 1)
            out.append(f"{flag}={absolute(value)}")
        else:
            expect = arg in PATH_FLAGS
            out.append(arg)
    return out
