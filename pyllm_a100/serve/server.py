"""The managed llama-server: configuration -> argv, start, load progress, readiness, stop, supervision.

``Server`` is a context manager::

    with Server("model.gguf", tensor_split="1x8") as srv:
        print(srv.base_url)          # ready: /health answered 200

This llama-server opens its port only after the model is loaded, so while loading,
liveness and progress come from the process itself (alive, bytes of the model mapped
or read); readiness is ``/health`` = 200. A child that dies is reported with its exit
status and the log lines that explain it (:mod:`pyllm_a100.failures`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from . import failures, tensor_mode
from ..errors import GpuSelectionError, PortInUse, ServerConfigError
from ..models.gguf_files import ModelFiles, resolve_model
from ..llamacpp.native import binary, build_info
from ..models.capacity import DEFAULT_SLOTS, Budget, Capacity
from .net import bind_refusal, free_port, host_problem, is_loopback
from .options import DEFAULT_QUEUE_TIMEOUT
from .process import ManagedProcess
from ..devices.splits import check_against_devices, parse_tensor_split, to_llama_arg

log = logging.getLogger(__name__)

DEFAULT_PORT = 8080
DEFAULT_CTX = 16384  # the pool when no memory plan is made (RPC workers hold layers: their memory is not planned)
SPLIT_MODES = ("layer", "tensor", "none")
# Request slots when --parallel is not given (models/capacity.py plans the KV pool for them). 16 from
# lab/notes/benchmarks.md, "Concurrency" (2x H200, real-shape V4 cut to 4 layers): at 16 streams 1.22x the
# aggregate of llama-server's 4 slots and TTFT p50 0.25 s instead of 1.53 s, one stream as fast as before.
DEFAULT_PARALLEL: int | None = DEFAULT_SLOTS
# llama-server flags after `--` that size the cache or the slots: given there, they are the user's and no plan is made
SIZING_FLAGS = frozenset({"-c", "--ctx-size", "-np", "--parallel", "-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified",
                          "--kv-unified-per-slot"})


@dataclasses.dataclass
class ServerConfig:
    """Everything that decides llama-server's command line; :meth:`to_argv` builds it."""

    model: ModelFiles
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    ctx_size: int | None = None  # None: min(model's training context, DEFAULT_CTX)
    n_gpu_layers: int | None = None  # None: all when CUDA and a GPU are there, else none
    tensor_split: list[float] | None = None
    split_mode: str | None = None
    parallel: int | None = None
    api_key_file: Path | None = None
    cors_origins: str | None = None  # None: the server's own origin
    alias: str | None = None
    rpc: list[Any] = dataclasses.field(default_factory=list)  # rpc.Endpoint: remote devices (rpc-server)
    draft: Any = None  # drafts.Draft: speculative decoding (--spec-draft-model, --spec-type, --spec-draft-n-max)
    extra_args: list[str] = dataclasses.field(default_factory=list)
    gpus: list[int] | None = None  # --gpus: nvidia-smi numbers; the child sees only these (child_env)
    metrics: bool = False  # llama-server's Prometheus endpoint, /metrics (behind the API key like every route)
    capacity: Capacity | None = None  # the planned pool and slots (None: sized after --, or not planned)
    queue_timeout: int | None = None  # seconds a request may wait for a slot and KV room (--queue-timeout; patch 0035)

    @property
    def served_name(self) -> str:
        return self.alias or self.model.name

    @property
    def effective_ctx(self) -> int:
        if self.capacity is not None:
            return self.capacity.pool
        if self.ctx_size is not None:
            return self.ctx_size
        trained = self.model.metadata.get(f"{self.model.architecture}.context_length")
        return min(int(trained), DEFAULT_CTX) if trained else DEFAULT_CTX

    @property
    def cors_allowed(self) -> str:
        """--cors-origins by default: cross-origin pages allowed are the loopback ones for a loopback
        bind (llama-server's ``localhost`` mode reflects http://127.0.0.1, localhost and [::1] origins),
        else the address users are told to use (``http://HOSTNAME:PORT`` for a wildcard bind, never
        ``http://0.0.0.0:PORT``). llama-server sends one Access-Control-Allow-Origin value as given, so
        one rule per bind; pages served by the server itself are same-origin and need none."""
        if self.cors_origins:
            return self.cors_origins
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
        if self.capacity is not None:
            argv += self.capacity.argv()
        else:  # sized after -- (those flags come last and win), or not planned (RPC): the fixed defaults
            given = set(self.extra_args)
            if not {"-c", "--ctx-size"} & given:
                argv += ["--ctx-size", str(self.effective_ctx)]
            if self.parallel is not None:
                argv += ["--parallel", str(self.parallel)]
            elif DEFAULT_PARALLEL is not None and not {"-np", "--parallel"} & given:
                argv += ["--parallel", str(DEFAULT_PARALLEL)] + ([] if SIZING_FLAGS & given else ["--kv-unified"])
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


def _local_gpus(selected: list[int] | None = None) -> tuple[int, int]:
    """(usable, visible): the CUDA GPUs llama-server can use here (none on a CPU build; with --gpus, those chosen)
    and those NVML shows this process (what --tensor-split counts without --gpus). NVML is asked once."""
    from ..devices.gpus import visible_gpus

    visible = len(visible_gpus()) if selected is None else len(selected)
    return (visible if build_info().get("cuda") else 0), visible


def select_gpus(text: str | Sequence[int]) -> list[int]:
    """--gpus checked against this machine (NVML) and this build (CUDA); nvidia-smi's numbers."""
    from ..devices import gpus as devices

    chosen = [g.physical_index for g in devices.select_gpus(text, devices.nvml_gpus())]
    if not build_info().get("cuda"):
        raise GpuSelectionError(f"--gpus {devices.format_gpu_list(chosen)}: this llama.cpp build has no CUDA (CPU only), "
                                "so llama-server cannot use a GPU: reinstall with CUDA (see README), or leave --gpus out")
    return chosen


def make_config(
    model: str | os.PathLike[str] | ModelFiles,
    *,
    host: str = "127.0.0.1",
    port: int | None = DEFAULT_PORT,
    ctx_size: int | None = None,
    n_gpu_layers: int | None = None,
    tensor_split: str | Sequence[float] | None = None,
    split_mode: str | None = None,
    parallel: int | None = None,
    api_key_file: str | os.PathLike[str] | None = None,
    cors_origins: str | None = None,
    alias: str | None = None,
    rpc: str | Sequence[Any] | None = None,
    draft: str | os.PathLike[str] | None = None,
    draft_max: int | None = None,
    extra_args: Sequence[str] = (),
    require_api_key: bool = True,
    gpus: str | Sequence[int] | None = None,
    metrics: bool = True,
    queue_timeout: int | None = DEFAULT_QUEUE_TIMEOUT,
) -> ServerConfig:
    """Validate every input before anything starts; raise one clear error per mistake.

    Order: the arguments themselves, then the model files, then the machine (GPUs, RPC
    workers, the port): a bad argument is reported as such even when, say, the port is busy.
    """
    # 1. the arguments alone
    if ctx_size is not None and ctx_size < 1:
        raise ServerConfigError(f"--ctx-size {ctx_size}: must be a positive number of tokens (e.g. 8192)")
    if parallel is not None and parallel < 1:
        raise ServerConfigError(f"--parallel {parallel}: must be at least 1")
    if queue_timeout is not None and not queue_timeout >= 0:
        raise ServerConfigError(f"--queue-timeout {queue_timeout}: give the seconds a request may wait for room in the "
                                "KV pool (0: as long as it takes)")
    if n_gpu_layers is not None and n_gpu_layers < -1:
        raise ServerConfigError(f"--n-gpu-layers {n_gpu_layers}: give 0 (CPU only), a number of layers (999 = all) "
                                "or -1 (llama.cpp decides); leave it out for all layers when a GPU is visible")
    if split_mode == "row":
        raise ServerConfigError("--split-mode row: the pinned llama.cpp's CUDA backend has no row-split buffers "
                                "(llama-server fails with 'does not support split buffers'): use layer (the default) or tensor")
    if split_mode is not None and split_mode not in SPLIT_MODES:
        raise ServerConfigError(f"--split-mode {split_mode}: choose one of {', '.join(SPLIT_MODES)}")
    if port is not None and port != 0 and not 1 <= port <= 65535:
        raise ServerConfigError(f"--port {port}: must be between 1 and 65535 (0: any free port)")
    problem = host_problem(host)
    if problem:
        raise ServerConfigError(f"--host {host!r} is {problem}: use 127.0.0.1 (this machine only), 0.0.0.0 (every interface) "
                                "or one of this machine's addresses (ip addr)")
    parts = parse_tensor_split(tensor_split) if tensor_split is not None else None
    if isinstance(gpus, str):
        from ..devices.gpus import parse_gpu_list

        parse_gpu_list(gpus)  # syntax first; the machine is asked below
    if api_key_file is not None:
        check_key_file(Path(api_key_file))
    if require_api_key and not is_loopback(host) and api_key_file is None:
        raise ServerConfigError(f"--host {host} is reachable from the network: give an API key (Server(api_key=...) or pyllm serve generates one)")
    if alias is not None and not alias.strip():
        raise ServerConfigError(f"--alias {alias!r}: give the model name clients will send (e.g. deepseek-v4-flash), or leave "
                                "it out for the file's name")
    if cors_origins is not None and not cors_origins.strip():
        raise ServerConfigError(f"--cors-origins {cors_origins!r}: give the origins to allow (e.g. https://chat.example.lan, "
                                "or '*'), or leave it out for the server's own origin")
    endpoints: list[Any] = []
    if isinstance(rpc, str) or rpc:  # a blank --rpc is refused (an unset $WORKERS), not read as "no workers"
        from . import rpc as rpc_module

        endpoints = rpc_module.parse_endpoints(rpc) if isinstance(rpc, str) else list(rpc)
    # 2. the model files
    files = model if isinstance(model, ModelFiles) else resolve_model(model)
    from ..models.drafts import refuse_as_model

    refuse_as_model(files)
    if draft_max is not None and draft is None:
        raise ServerConfigError(f"--draft-max {draft_max} needs a draft: add --draft PATH (or --draft auto)")
    spec = None
    if draft is not None:
        from ..models.drafts import resolve as resolve_draft

        spec = resolve_draft(files, draft, draft_max).with_default_max()
    # 3. the machine: RPC workers, devices, then the address
    if port is None or port == 0:
        port = free_port(host if is_loopback(host) else "0.0.0.0")
    if endpoints:
        from . import rpc as rpc_module

        for endpoint in endpoints:
            rpc_module.hello(endpoint)  # each worker must answer before llama-server is started
    selected = select_gpus(gpus) if gpus is not None else None
    usable, visible = _local_gpus(selected)  # the machine asked once
    if (split_mode or tensor_mode.flag_value(extra_args, tensor_mode.SPLIT_MODE)) == "tensor":  # -sm after `--` too
        tensor_mode.check(files.architecture, extra_args, usable + len(endpoints))
    if parts is not None:
        if endpoints:
            from .rpc import list_devices
            from ..devices.gpus import child_env

            env = child_env(selected) if selected is not None else None  # the GPUs llama-server will see
            n_devices = len(list_devices(endpoints, env=env))  # local GPUs and remote devices, in llama.cpp's order
        else:
            n_devices = visible
        check_against_devices(parts, n_devices, text=str(tensor_split), gpus=selected)
    refused = bind_refusal(host, port)  # last: a busy port never hides a mistake found above
    if refused:
        in_use, reason = refused
        if in_use:
            raise PortInUse(f"{reason}: pass another --port, or stop that server (pyllm ps / pyllm stop)")
        raise ServerConfigError(reason)
    if n_gpu_layers is None:
        n_gpu_layers = 999 if endpoints or usable else None  # all layers on the GPUs (remote devices hold layers too)
    capacity = None if endpoints or SIZING_FLAGS & set(extra_args) else plan_capacity(
        files, ctx_size=ctx_size, parallel=parallel, gpus=selected if selected is not None else usable,
        n_gpu_layers=n_gpu_layers, split=parts)
    return ServerConfig(
        model=files, host=host, port=port, ctx_size=ctx_size, n_gpu_layers=n_gpu_layers, tensor_split=parts,
        split_mode=split_mode, parallel=parallel, api_key_file=Path(api_key_file) if api_key_file else None,
        cors_origins=cors_origins, alias=alias, rpc=endpoints, draft=spec, extra_args=list(extra_args),
        gpus=selected, metrics=metrics, capacity=capacity, queue_timeout=queue_timeout,
    )


def plan_capacity(files: ModelFiles, *, ctx_size: int | None, parallel: int | None, gpus: Sequence[int] | int,
                  n_gpu_layers: int | None, split: list[float] | None) -> Capacity | None:
    """The KV pool and slots for this model on this machine (models/capacity.py): the GPUs' memory when every layer
    is offloaded to them, else RAM. A --ctx-size or --parallel that cannot fit is refused, naming the largest pool
    that does; when not even the default plan fits (the weights alone), None: llama.cpp's --fit decides, as before."""
    from ..models import capacity
    from ..models.memplan import local_shape

    shape = local_shape(files)
    budget = None
    if gpus and n_gpu_layers is not None and n_gpu_layers >= shape.n_layer + 1:
        from ..devices.gpus import visible_gpus

        present = visible_gpus()
        chosen = [g for g in present if g.physical_index in gpus] if not isinstance(gpus, int) else present[:gpus]
        if chosen:
            budget = Budget.gpus([g.memory_total for g in chosen], [g.memory_total - g.memory_free for g in chosen])
    if budget is None:
        import psutil

        # the default pool takes a share of RAM; a pool the user asks for only has to fit what is available
        budget = Budget.cpu(psutil.virtual_memory().available, whole=ctx_size is not None)
    plan = capacity.plan(shape, budget, slots=parallel, pool=ctx_size, split=split)
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


# --- the process -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoadProgress:
    phase: str  # "loading" (model bytes coming in), "preparing" (all mapped, not ready yet), "ready"
    loaded: int  # bytes of the model read or mapped so far
    total: int
    seconds: float

    @property
    def fraction(self) -> float:
        return min(1.0, self.loaded / self.total) if self.total else 0.0


def _process_bytes(pid: int) -> int:
    """Bytes of files this process has mapped (RssFile) or read (rchar, read_bytes), whichever is most.

    With mmap (llama.cpp's default) the model's pages become resident as they are
    touched, whether they came from disk or the page cache; with --no-mmap they are read().
    """
    best = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            match = re.search(r"RssFile:\s+(\d+) kB", f.read())
            if match:
                best = int(match[1]) * 1024
    except OSError:
        return 0
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("rchar", "read_bytes"):
                    best = max(best, int(value))
    except OSError:
        pass
    return best


class Server(ManagedProcess):
    """A managed llama-server: start, wait until /health is 200, stop; optional supervision."""

    name = "llama-server"

    def __init__(
        self,
        model: str | os.PathLike[str] | ModelFiles | None = None,
        *,
        config: ServerConfig | None = None,
        api_key: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ready_timeout: float | None = None,
        restart: int = 0,
        on_progress: Callable[[LoadProgress], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
        server_binary: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        """``server_binary``: another llama-server to run with the same configuration (a benchmark's baseline)."""
        if config is None:
            if model is None:
                raise ServerConfigError("Server needs a model (a .gguf file, shard 1 of a set, or a folder)")
            if api_key is not None and "api_key_file" not in options:
                options["api_key_file"] = self._write_key_file(check_api_key(api_key), log_path)
            config = make_config(model, **options)
        self.config = config
        self.api_key = api_key
        if config.gpus is not None:
            env = config.child_env(env)  # --gpus: CUDA_VISIBLE_DEVICES for the child only
        self.on_progress = on_progress
        self._loaded = 0
        executable = check_server_binary(server_binary) if server_binary is not None else binary("llama-server")
        super().__init__(config.to_argv(executable), log_path=log_path, ready_timeout=ready_timeout,
                         restart=restart, on_event=on_event, env=env)

    @staticmethod
    def _write_key_file(api_key: str, log_path: str | os.PathLike[str] | None) -> Path:
        """The key as a file llama-server reads (--api-key-file): never on its command line."""
        import tempfile

        from ..home import write_secret

        directory = Path(log_path).parent if log_path else Path(tempfile.mkdtemp(prefix="pyllm-key-"))
        return write_secret(directory / "api_key", api_key)

    # -- addresses

    @property
    def host_for_clients(self) -> str:
        host = self.config.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"[{host}]" if ":" in host else host

    @property
    def base_url(self) -> str:
        return f"http://{self.host_for_clients}:{self.config.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    # -- readiness and progress

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self) -> bool:
        return self.healthy(timeout=1.0)

    def _spawn(self) -> None:
        self._loaded = 0
        super()._spawn()

    def on_waiting(self) -> None:
        assert self.proc is not None
        total = self.config.model.total_bytes
        self._loaded = max(self._loaded, _process_bytes(self.proc.pid))
        if self.on_progress:
            phase = "loading" if self._loaded < total * 0.98 else "preparing"
            self.on_progress(LoadProgress(phase, min(self._loaded, total), total, time.monotonic() - self._started_at))

    def on_ready(self) -> None:
        if self.on_progress:
            total = self.config.model.total_bytes
            self.on_progress(LoadProgress("ready", total, total, time.monotonic() - self._started_at))

    def explain(self, code: int | None) -> str:
        return failures.explain(self.log_text(), code, self.config, log_path=self.log_path)
