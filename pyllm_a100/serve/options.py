"""Every option of `pyllm serve`, defined once.

:class:`ServeOptions` is the one definition (the request): the `pyllm serve` command is generated from its fields
(their help, environment variable and default: cli/generated.py), :func:`resolve.resolve` turns it, once, into the
frozen ServerConfig whose argv is llama-server's command line (argv.py), a detached supervisor runs what was
resolved (request.json: persist.py), `pyllm ps --json` shows it (secrets left out) and `pyllm service install`
writes a unit's command line from the fields that differ from their defaults. A new option is one field here.
"""

from __future__ import annotations

import dataclasses
from ..command_options import RESTART_HELP, CommandOptions, argument, internal, option
from ..models.gguf_files import MODEL_FORMS
from ..planning.capacity import DEFAULT_SLOTS

MODEL_HELP = MODEL_FORMS[0].upper() + MODEL_FORMS[1:] + "."

# Co-tenancy (issue 55; patch 0044): while a prompt is prefilled, decoding streams get a token every 100 ms on average
# (prompt steps of up to 3 targets, decode-only steps between them), steps of at least 64 prompt tokens; a step takes
# at most 512 prompt tokens (llama.cpp: 2048), which cost a 64k prefill nothing measurable on the H200 (41.0 vs 41.1
# s) and bounds a newcomer's wait. Measured (docs/performance.md): 100 ms keeps 14 % of a stream's solo speed at a
# 1.39x prefill, 50 ms 28 % at 1.78x; time-slicing one GPU cannot give both 25 % and 1.15x.
DEFAULT_DECODE_LATENCY_TARGET = 100
# Prefill lane (issue 61; patch 0049): on GPUs a prompt of 2,048 new tokens or more is prefilled in a second
# llama_context on its own thread while the slots decode. H200 under A100 dispatch, a 64k prefill beside a stream
# (docs/performance.md): 43-layer V4 30 % of solo at 1.06x, GLM-5 12 layers 26 % at 1.07x (time-slicing alone: 14 % at
# 1.39x). On 2 CPU cores the two contexts share the cores and the prefill slowed 1.4-2.2x: off there.
DEFAULT_PREFILL_LANE = 2048
DEFAULT_PREFILL_MIN_CHUNK = 64
DEFAULT_BATCH_SIZE = 512
# Request slots when --parallel is not given (planning/capacity.py plans the KV pool for them). 16, measured on two
# H200s with the real-shape V4 cut to 4 layers: at 16 streams 1.22x the aggregate of llama-server's 4 slots and
# TTFT p50 0.25 s instead of 1.53 s, one stream as fast as before (docs/performance.md, "Concurrency").
DEFAULT_PARALLEL: int | None = DEFAULT_SLOTS
DEFAULT_QUEUE_TIMEOUT = 600  # seconds a request may wait for a slot and KV space before a 503 (llama-server's own: no bound)
# A baseline's options: scheduling left to llama-server's own defaults (-b 2048, no decode latency target, no lane)
LLAMA_CPP_SCHEDULING = {"decode_latency_target": None, "prefill_min_chunk": None, "batch_size": None,
                        "prefill_lane": 0}


@dataclasses.dataclass(frozen=True)
class ServeOptions(CommandOptions):
    """What `pyllm serve` is asked (``Server(...)`` takes the same names as keyword arguments)."""

    model: str = argument(MODEL_HELP)  # the library also takes a Path or resolved ModelFiles
    tensor_split: str | None = option(None, "How to spread layers over GPUs: 1x8, 3,1, 2x2,1x4.")
    split_mode: str | None = option(None, "layer (default), tensor or none (row is gone from llama.cpp's CUDA backend).")
    ctx_size: int | None = option(None, "KV cache pool in tokens, shared by the slots (default: planned from the "
                                         "memory free after weights and compute buffers; pyllm doctor shows the plan).")
    parallel: int | None = option(None, "Request slots served at once (default: 16, fewer when memory is short); "
                                        "each slot holds up to the model's trained context.")
    queue_timeout: int = option(DEFAULT_QUEUE_TIMEOUT, "Seconds a request may wait for room in the KV pool before it "
                                                         "gets HTTP 503 with Retry-After (0: wait as long as it takes).")
    decode_latency_target: int | None = option(
        DEFAULT_DECODE_LATENCY_TARGET, "Average milliseconds between the tokens of the requests that are decoding while "
        "others' prompts are prefilled: prompts advance in steps of up to 3 targets, with decode-only steps between "
        "them (the server measures its own step costs), so one long prompt no longer stalls every stream. Lower: faster "
        "streams, slower prefill (50: a stream keeps ~28 % of its speed, the prefill takes ~1.8x). 0: llama.cpp's own "
        "scheduling (each step takes a full --batch-size of prompt).")
    prefill_lane: int | None = option(
        None, "Prompts of at least this many new tokens are prefilled in a second context beside the decoding one (a "
        "prefill lane; its KV cache holds one slot's context and is planned with the pool), so the GPU runs the prefill "
        "and the other streams' decode steps at once instead of taking turns. One prompt at a time; others take "
        "--decode-latency-target's turns. Default: 2048 when the layers are on GPUs, 0 (off) on the CPU, where two "
        "contexts would share the same cores.")
    prefill_min_chunk: int | None = option(
        None, "Prompt tokens a step takes at least while others decode: the floor that keeps a long prefill efficient "
        "when --decode-latency-target is tight. Default: 64 when the layers are on GPUs; a full --batch-size on the "
        "CPU, where small chunks deep in a prompt run at half speed.")
    batch_size: int | None = option(
        DEFAULT_BATCH_SIZE, "Prompt tokens one step may take when nobody is decoding (llama-server -b): a request that "
        "arrives waits at most one such step.")
    host: str = option("127.0.0.1", "Address to bind; anything but loopback requires an API key.")
    port: int = option(8080, "Port to listen on (0: any free port).")
    api_key: str | None = option(None, "Require this API key (generated for non-loopback hosts). Prefer PYLLM_API_KEY: "
                                       "a value given here shows in ps.", envvar="PYLLM_API_KEY", secret=True)
    n_gpu_layers: int | None = option(None, "Layers on GPU (default: all when a GPU is visible).")
    cors_origins: str | None = option(None, "Widen CORS beyond the server's own origin (e.g. '*').")
    alias: str | None = option(None, "Model name clients use (default: the file's).")
    name: str | None = option(None, "Name in pyllm ps/stop/logs: letters, digits, . _ - (default: MODEL-PORT).",
                              not_in_unit="the service's NAME is the server's name: drop --name")
    rpc: str | None = option(None, "rpc-server workers HOST:PORT[,...] holding layers too (pyllm rpc-worker).")
    draft: str | None = option(None, "Speculative decoding: a draft GGUF (DSpark, MTP or a small model of the same "
                                     "vocabulary; the kind is read from the file), or auto for the one `pyllm fetch "
                                     "--draft` put beside the model.")
    draft_max: int | None = option(None, "Tokens drafted per step (llama-server's --spec-draft-n-max). Default 2 "
                                          "for DSpark/DFlash/MTP (best measured on a MoE verify), llama-server's own for a "
                                          "small-model draft; `pyllm bench speculate` finds your best.")
    detach: bool = option(False, "Return once ready; a supervisor keeps it running.",
                          not_in_unit="a service runs pyllm serve in the foreground (systemd supervises it): drop --detach")
    restart: int | None = option(None, RESTART_HELP)
    gpus: str | None = option(None, "GPUs this server uses, numbered as nvidia-smi numbers them: 0-3, 4-7, 0,1 or 2 "
                                    "(default: every visible one).")
    metrics: bool = option(True, "llama-server's Prometheus endpoint, /metrics (behind the API key): tokens, requests "
                                 "running and waiting, the KV pool; pyllm ps reads it, pyllm metrics NAME has the supervisor's.")
    # llama-server's own flags, given after `--` (not an option of its own)
    extra_args: tuple[str, ...] = internal(())
    # Not on the command line (Server(...) and the benchmarks set them): a file holding the API key (pyllm serve
    # writes one for --api-key or a generated key), and exact slot sizing: with --parallel, True gives the slots one
    # shared pool of --ctx-size tokens (--kv-unified) and False each slot ctx/parallel; either way no memory plan.
    api_key_file: str | None = internal()
    kv_unified: bool | None = internal()

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_args", tuple(self.extra_args))  # frozen all the way down
