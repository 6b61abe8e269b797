"""Memory plan: weights, KV cache and compute buffers per GPU for a model at a context and slot count.

``pyllm doctor MODEL --gpus 8x80 --ctx-size 131072 --parallel 4`` answers "which quantization fits
these GPUs, and with what ``pyllm serve`` command" before a download or a 15-minute load. MODEL is
a synth preset (one row per weight type, sizes from synth's plan: nothing written), a local GGUF or
shard set (its own quantization; llama.cpp's ``llama-fit-params`` figure beside ours), or a hub repo
(one row per quantization folder, sizes from the hub's listing, hyperparameters from the first
shard's GGUF header fetched with an HTTP Range request).

``ctx`` is the context of each slot (what one request can hold): the server gets
``--ctx-size ctx*slots --parallel slots``, and llama.cpp's non-unified cache gives each slot
``n_ctx_seq = ctx`` cells (llama-context.cpp:292-304; an explicit ``--parallel`` turns the unified
cache off, tools/server/server.cpp:157-160).

What the estimate counts, per GPU under an even layer split (llama-model.cpp:1589-1614: layer ``il``
goes to the device whose cumulative split first exceeds ``il / (n_layer + 1)``, the output layer
counting as layer ``n_layer``; the token embedding stays in host memory):

- weights: the bytes of each ``blk.N.`` tensor on that layer's GPU, the output head on the last;
- KV cache: per layer and cell, from the pin's cache classes (type_k F16 unless ``-ctk``);
- compute buffer: an allowance from the graph's largest per-layer tensors (see :func:`compute_bytes`);
- CUDA overhead: the CUDA context, cuBLAS workspace and llama.cpp's memory pools, which nvidia-smi
  counts and llama.cpp's buffer report does not (:data:`CUDA_OVERHEAD_MIB`).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import math
import re
import shlex
from typing import Any

from ..errors import InvalidArgument

log = logging.getLogger(__name__)

MIB = 1 << 20
GIB = 1 << 30
N_UBATCH = 512  # llama-server's default micro-batch: the reserve graph's token count
CUDA_OVERHEAD_MIB = 768  # per GPU: CUDA context (~500 MiB on A100/H200), cuBLAS workspace, pools; not in llama.cpp's buffer report
FIT_MARGIN_MIB = 1024  # llama.cpp's --fit leaves this much free per device by default (common/arg.cpp --fit-target)
CACHE_PAD = 256  # llama-context.cpp:289 pads n_ctx (and n_ctx_seq) to 256 cells
DSV4_CSA, DSV4_HCA = 4, 128  # llama-kv-cache-dsv4.h compression ratios
_GPUS = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+(?:\.\d+)?)\s*(?:G|GB|GiB)?\s*$")


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """``8x80``: eight GPUs of 80 GiB each (what nvidia-smi reports as total / 1024)."""

    count: int
    gib: float

    @property
    def bytes_each(self) -> int:
        return int(self.gib * GIB)

    def __str__(self) -> str:
        return f"{self.count}x{self.gib:g}"


def parse_gpus(text: str) -> GpuSpec:
    """``"8x80"`` -> GpuSpec(8, 80.0); anything else is one line that shows the form."""
    m = _GPUS.match(text or "")
    if m is None:
        raise InvalidArgument(f"--gpus {text!r}: write COUNTxGIB, e.g. 8x80 for eight 80 GB A100s or 2x141 for two H200s, "
                              "or GPU numbers of this machine (0-3) to plan for those")
    count, gib = int(m[1]), float(m[2])
    if count < 1 or count > 64:
        raise InvalidArgument(f"--gpus {text}: the GPU count must be between 1 and 64")
    if gib <= 0:
        raise InvalidArgument(f"--gpus {text}: the memory per GPU must be more than 0 GiB")
    return GpuSpec(count, gib)


@dataclasses.dataclass
class Shape:
    """What the estimate needs from one model in one quantization."""

    label: str  # the quantization (or synth weight type)
    arch: str
    metadata: dict[str, Any]  # GGUF keys, full names ("glm-dsa.block_count")
    layer_bytes: list[int]  # weights of each trunk layer (blk.0 .. blk.n_layer-1)
    input_bytes: int  # token embedding: host memory
    output_bytes: int  # output head, final norm and other global tensors: the last GPU
    skipped_bytes: int = 0  # in the files but never loaded (NextN/MTP layers without a draft context)
    tensor_types: dict[str, int] = dataclasses.field(default_factory=dict)
    path: str | None = None  # shard 1 (local) or repo path (hub)
    files_bytes: int | None = None  # what the files hold (the hub's listing or the disk)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{key}", default)

    @property
    def n_layer(self) -> int:
        return len(self.layer_bytes)

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.input_bytes + self.output_bytes


# --- KV cache -------------------------------------------------------------------------------


def pad(n: int, to: int = CACHE_PAD) -> int:
    return (n + to - 1) // to * to


def cells(ctx: int, slots: int) -> tuple[int, int]:
    """(n_ctx_seq, n_stream): each slot's cells and the number of streams, as llama-context.cpp:288-304."""
    n_ctx = pad(ctx * slots)
    if slots == 1:
        return n_ctx, 1
    return pad(n_ctx // slots), slots


def _indexer_full(shape: Shape) -> list[bool]:
    """Which glm-dsa layers own an indexer (and its key cache): models/glm-dsa.cpp:59-66."""
    n = shape.n_layer
    types = shape.get("attention.indexer.types")
    if isinstance(types, list) and len(types) >= n:
        return [bool(t) for t in types[:n]]
    if shape.arch != "glm-dsa" or int(shape.get("context_length") or 0) < 1048576:
        return [True] * n  # GLM-5 / 5.1 and DeepSeek-V3.2: every layer
    pattern = [1, 1] + [1, 0, 0, 0] * 19  # GLM_5_2_DEFAULT_INDEXER_TYPES
    return [bool(pattern[i]) if i < len(pattern) else False for i in range(n)]


def kv_layer_bytes(shape: Shape, ctx: int, slots: int, *, type_k_bytes: float = 2.0, type_v_bytes: float = 2.0,
                   n_ubatch: int = N_UBATCH) -> list[int]:
    """KV cache bytes of each trunk layer (its GPU holds them) at ``ctx`` cells per slot and ``slots`` slots."""
    n_seq, n_stream = cells(ctx, slots)
    n_cells = n_seq * n_stream
    arch = shape.arch
    if arch in ("glm-dsa", "deepseek32"):
        # llama-model.cpp:2397-2450: llama_kv_cache_dsa = an MLA cache (K only, llama-kv-cache.cpp:231 has_v = !is_mla)
        # of n_embd_k_gqa = key_length (kv_lora_rank + rope dims) x 1 head, plus an indexer key cache of
        # indexer.key_length x 1 head (llama-kv-cache-dsa.cpp:41-50) on indexer layers; NextN layers filtered out.
        k_row = int(shape.get("attention.key_length") or 0) * int(shape.get("attention.head_count_kv") or 1)
        idx_row = int(shape.get("attention.indexer.key_length") or 0)
        return [int(n_cells * (k_row + (idx_row if full else 0)) * type_k_bytes) for full in _indexer_full(shape)]
    if arch == "deepseek4":
        # llama-kv-cache-dsv4.cpp:1210-1330: streams per slot always (unified_raw = false); a raw sliding-window
        # K cache on every layer (llama-kv-cache-iswa.cpp:73: pad(min(n_seq, n_swa + n_ubatch))), compressed K caches
        # of ceil(n_seq / ratio) cells on CSA (4) and HCA (128) layers, an indexer key cache on CSA layers, and F32
        # compressor states (kv + score planes, llama-kv-cache-dsv4.cpp:965-966).
        n_stream = slots
        n_seq = n_ctx_seq = pad(pad(ctx * slots) // slots) if slots > 1 else pad(ctx)
        head = int(shape.get("attention.key_length") or 0)
        idx = int(shape.get("attention.indexer.key_length") or 0)
        swa = pad(min(n_ctx_seq, int(shape.get("attention.sliding_window") or 0) + n_ubatch))
        ratios = shape.get("attention.compress_ratios") or [0] * shape.n_layer
        out = []
        for il in range(shape.n_layer):
            r = int(ratios[il]) if il < len(ratios) else 0
            b = swa * head * type_k_bytes
            if r:
                comp = pad(max(1, -(-n_seq // r)))
                b += comp * head * type_k_bytes
                if r == DSV4_CSA:
                    b += comp * idx * type_k_bytes
                    b += 2 * 4 * (2 * r) * (2 * head + 2 * idx)  # CSA and indexer compressor states
                else:
                    b += 2 * 4 * r * head
            out.append(int(b * n_stream))
        return out
    # llama-kv-cache.cpp:209-234: K and V rows of head_count_kv x head size per layer
    n_head = int(shape.get("attention.head_count") or 1)
    n_head_kv = shape.get("attention.head_count_kv") or n_head
    n_embd = int(shape.get("embedding_length") or 0)
    k_len = int(shape.get("attention.key_length") or (n_embd // n_head))
    v_len = int(shape.get("attention.value_length") or (n_embd // n_head))
    out = []
    for il in range(shape.n_layer):
        kv_heads = int(n_head_kv[il] if isinstance(n_head_kv, list) else n_head_kv)
        out.append(int(n_cells * kv_heads * (k_len * type_k_bytes + v_len * type_v_bytes)))
    return out


# --- compute buffer -------------------------------------------------------------------------


def compute_bytes(shape: Shape, ctx: int, slots: int, *, n_ubatch: int = N_UBATCH) -> tuple[int, int]:
    """(a layer-holding GPU's compute buffer, the output GPU's): llama.cpp's compute buffers, as an allowance.

    ggml-alloc reuses memory between layers, so a buffer is the largest set of tensors live at once in the
    reserve graph (n_ubatch tokens, every cell visible: llama-kv-cache.cpp:2795 init_full). Two peaks:
    inside a layer, a producer and a consumer of the widest micro-batch activation (the MLA query rows, the
    routed experts' gate/up rows or the indexer queries) plus, for DSA, the indexer scores and masks that grow
    with n_kv and the top-k tensors that grow with min(n_kv, top_k) (indices and the zero rows scattered into
    the mask, llama-graph.cpp:3079-3088); at the output, the F32 logits of one output per slot. The factors are fitted on llama-server's
    CPU reserve (docs/memory-plan.md: tiny-glm-dsa and glm-5 cut to 4 layers), where the GPU check's figures are too.
    """
    n_embd = int(shape.get("embedding_length") or 0)
    n_head = int(shape.get("attention.head_count") or 1)
    n_seq, _ = cells(ctx, slots)
    used = int(shape.get("expert_used_count") or 0)
    n_ff_exp = int(shape.get("expert_feed_forward_length") or 0)
    n_ff = shape.get("feed_forward_length") or 0
    n_ff = int(max(n_ff) if isinstance(n_ff, list) else n_ff)
    k_len = int(shape.get("attention.key_length") or (n_embd // max(n_head, 1)))
    idx = int(shape.get("attention.indexer.head_count") or 0) * int(shape.get("attention.indexer.key_length") or 0)
    # the query path holds three rows of n_head x key_length at once (absorbed nope, rope part, their concat);
    # the others a producer and a consumer
    widest = max(3 * n_head * k_len, 2 * n_embd, 2 * used * n_ff_exp * 2, 2 * n_ff, 2 * idx)
    layer = 4 * n_ubatch * widest
    if shape.arch in ("glm-dsa", "deepseek32"):
        top_k = int(shape.get("attention.indexer.top_k") or n_seq)
        small = layer + 4 * n_ubatch * idx + 8 * n_seq * n_ubatch + 8 * min(n_seq, top_k) * n_ubatch
        # past ~12k cells per stream the indexer's own [n_kv, n_ubatch] tensors (scores, their sort, the mask) are
        # the peak, 24 bytes a cell (CPU reserve of tiny-glm-dsa, one stream of 2,048..65,536 cells: 55.8, 71.8,
        # 103.8, 215.8, 407.8, 791.8 MiB; docs/memory-plan.md)
        layer = max(small, 4 * n_ubatch * idx + 24 * n_seq * n_ubatch)
    elif shape.arch == "deepseek4":
        top_k = int(shape.get("attention.indexer.top_k") or 0)
        n_kv = int(shape.get("attention.sliding_window") or 0) + n_ubatch + min(-(-n_seq // DSV4_CSA), top_k)
        layer += 8 * n_kv * n_ubatch
    else:
        layer += (2 + 4 * n_head) * n_seq * n_ubatch  # F16 mask with flash attention; F32 KQ scores without
    n_vocab = int(shape.metadata.get("tokenizer.ggml.tokens.length") or shape.get("vocab_size") or 0)
    # llama-server reserves logits for one output per slot (llama-context.cpp:670 n_outputs_max)
    output = 4 * n_vocab * slots + 2 * 4 * n_embd * n_ubatch
    return layer, max(layer, output)


# --- the plan -------------------------------------------------------------------------------


def layer_devices(n_layer: int, n_devices: int, split: list[float] | None = None) -> list[int]:
    """Device index of layers 0..n_layer (the last entry: the output layer), as llama-model.cpp:1580-1614."""
    split = split or [1.0] * n_devices
    total = sum(split)
    points, acc = [], 0.0
    for part in split:
        acc += part
        points.append(acc / total)
    act = n_layer + 1
    return [min(bisect.bisect_right(points, il / act), n_devices - 1) for il in range(n_layer + 1)]


@dataclasses.dataclass
class DevicePlan:
    device: str
    layers: int
    weights: int
    kv: int
    compute: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.overhead


@dataclasses.dataclass
class Row:
    label: str
    weight_bytes: int
    host_bytes: int  # token embedding (host memory)
    kv_bytes: int
    compute_bytes: int  # the largest GPU's allowance
    devices: list[DevicePlan]
    fits: bool
    serve: str | None  # a command that fits (possibly with less context), or None
    note: str = ""
    llama_fit_mib: dict[str, dict[str, int]] | None = None  # llama-fit-params' own figure (local files)
    tensor_types: dict[str, int] = dataclasses.field(default_factory=dict)
    capacity: dict[str, Any] | None = None  # the pool and slots pyllm serve would plan (planning/capacity.py)

    @property
    def max_device(self) -> int:
        return max(d.total for d in self.devices)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["max_device_bytes"] = self.max_device
        for d, plan in zip(out["devices"], self.devices):
            d["total"] = plan.total
        return out


def per_device(shape: Shape, n_devices: int, ctx: int, slots: int, *, gpu: bool = True,
               type_k_bytes: float = 2.0, split: list[float] | None = None, lane: int = 0) -> list[DevicePlan]:
    """Weights, KV, compute and overhead per device under ``split`` (even by default). ``lane``: the cells of a
    prefill lane (llama-server --prefill-lane: a second context of one sequence, with its own KV cache and compute
    buffer on every device that holds layers), 0 for none."""
    where = layer_devices(shape.n_layer, n_devices, split)
    kv = kv_layer_bytes(shape, ctx, slots, type_k_bytes=type_k_bytes, type_v_bytes=type_k_bytes)
    compute, at_output = compute_bytes(shape, ctx, slots)
    if lane:
        lane_kv = kv_layer_bytes(shape, lane, 1, type_k_bytes=type_k_bytes, type_v_bytes=type_k_bytes)
        kv = [a + b for a, b in zip(kv, lane_kv)]
        lane_compute, lane_output = compute_bytes(shape, lane, 1)
        compute, at_output = compute + lane_compute, at_output + lane_output
    out = []
    for d in range(n_devices):
        mine = [il for il in range(shape.n_layer) if where[il] == d]
        weights = sum(shape.layer_bytes[il] for il in mine) + (shape.output_bytes if where[-1] == d else 0)
        holds = bool(mine) or where[-1] == d
        out.append(DevicePlan(
            device=f"CUDA{d}" if gpu else "CPU", layers=len(mine), weights=weights, kv=sum(kv[il] for il in mine),
            compute=(at_output if where[-1] == d else compute) if holds else 0,
            overhead=CUDA_OVERHEAD_MIB * MIB if gpu else 0,
        ))
    return out


def serve_command(model: str, gpus: GpuSpec, ctx: int, slots: int) -> str:
    split = f" --tensor-split 1x{gpus.count}" if gpus.count > 1 else ""
    return f"pyllm serve {shlex.quote(str(model))}{split} --ctx-size {ctx * slots} --parallel {slots}"


def plan_row(shape: Shape, model_arg: str, gpus: GpuSpec, ctx: int, slots: int, *, type_k_bytes: float = 2.0) -> Row:
    """One row: does ``shape`` fit ``gpus`` at ``ctx`` per slot x ``slots``; else the largest context that does."""
    budget = gpus.bytes_each - FIT_MARGIN_MIB * MIB
    devices = per_device(shape, gpus.count, ctx, slots, type_k_bytes=type_k_bytes)
    fits = max(d.total for d in devices) <= budget
    serve, note = None, ""
    if fits:
        serve = serve_command(model_arg, gpus, ctx, slots)
    else:
        smaller = ctx
        while smaller > 4096:
            smaller = max(4096, smaller // 2)
            if max(d.total for d in per_device(shape, gpus.count, smaller, slots, type_k_bytes=type_k_bytes)) <= budget:
                serve = serve_command(model_arg, gpus, smaller, slots)
                note = f"fits with {smaller} tokens per slot, not {ctx}"
                break
        room = budget - CUDA_OVERHEAD_MIB * MIB
        if serve is None and room <= 0:
            note = (f"a {gpus.gib:g} GiB GPU holds nothing: llama.cpp keeps {FIT_MARGIN_MIB} MiB free and CUDA takes "
                    f"about {CUDA_OVERHEAD_MIB} MiB")
        elif serve is None:
            need = shape.weight_bytes - shape.input_bytes
            at_least = math.ceil(need / room)
            note = (f"weights alone need {shape.weight_bytes / GIB:.1f} GiB, {need / GIB:.1f} GiB of it on the GPUs "
                    f"(the token embedding stays in host memory): at least {at_least} GPUs of {gpus.gib:g} GiB")
    return Row(
        label=shape.label, weight_bytes=shape.weight_bytes, host_bytes=shape.input_bytes,
        kv_bytes=sum(kv_layer_bytes(shape, ctx, slots, type_k_bytes=type_k_bytes, type_v_bytes=type_k_bytes)),
        compute_bytes=max(d.compute for d in devices), devices=devices, fits=fits, serve=serve, note=note,
        tensor_types=dict(shape.tensor_types),
    )


# --- shapes from the three sources ------------------------------------------------------------


_BLOCK = re.compile(r"^blk\.(\d+)\.")


def shape_from_tensors(label: str, arch: str, metadata: dict[str, Any], tensor_bytes: dict[str, int],
                       tensor_types: dict[str, int] | None = None) -> Shape:
    """Bucket tensor bytes into layers, the host-side embedding and the output head."""
    n_layer_all = int(metadata.get(f"{arch}.block_count") or 0)
    nextn = int(metadata.get(f"{arch}.nextn_predict_layers") or 0)
    n_layer = n_layer_all - nextn
    layers = [0] * n_layer
    input_bytes = output_bytes = skipped = 0
    for name, size in tensor_bytes.items():
        m = _BLOCK.match(name)
        if m:
            il = int(m[1])
            if il < n_layer:
                layers[il] += size
            else:
                skipped += size  # NextN/MTP blocks: TENSOR_SKIP without a draft context (models/glm-dsa.cpp:84-92)
        elif name == "token_embd.weight":
            input_bytes += size
        else:
            output_bytes += size
    return Shape(label, arch, metadata, layers, input_bytes, output_bytes, skipped, dict(tensor_types or {}))


def preset_shapes(preset_name: str, *, layers: int | None = None, experts: int | None = None) -> list[Shape]:
    """One shape per synth weight type of a preset (sizes from synth's plan; nothing is written)."""
    from ..synth import writer as synth

    the_plan = synth.plan(preset_name, layers, experts)
    p = synth.preset(preset_name)
    metadata: dict[str, Any] = {"general.architecture": the_plan.arch, "tokenizer.ggml.tokens.length": p.hparams["n_vocab"]}
    metadata.update({key: value for key, value, _ in the_plan.kv})
    shapes = []
    for wtype in synth.WEIGHT_TYPES:
        try:
            typed = synth.typed_tensors(the_plan, wtype)
        except synth.SynthError:
            continue  # e.g. nvfp4-mix for an architecture whose graph ignores NVFP4's scales
        sizes = {t.name: synth.tensor_nbytes(t, g) for t, g in typed}
        types: dict[str, int] = {}
        for _, g in typed:
            types[g.name] = types.get(g.name, 0) + 1
        shapes.append(shape_from_tensors(wtype, the_plan.arch, metadata, sizes, types))
    return shapes


def local_shape(files: Any) -> Shape:
    """A local GGUF (a :class:`~pyllm_a100.models.gguf_files.ModelFiles`): its own quantization, exact tensor bytes."""
    label = str(files.metadata.get("pyllm.weight_type") or _file_type_name(files.metadata) or "file")
    shape = shape_from_tensors(label, files.architecture, files.metadata, files.tensor_bytes, files.tensor_types)
    shape.path, shape.files_bytes = str(files.first), files.total_bytes
    return shape


def _file_type_name(metadata: dict[str, Any]) -> str | None:
    ftype = metadata.get("general.file_type")
    if ftype is None:
        return None
    try:
        from gguf import LlamaFileType

        return LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return str(ftype)


def hub_shape(label: str, header_metadata: dict[str, Any], first_shard_tensors: dict[str, int], total_bytes: int,
              tensor_types: dict[str, int], path: str) -> Shape:
    """A hub quantization from its listing (total bytes) and shard 1's header (hparams, and the tensors it holds).

    Layer bytes are the listing's total less the embedding and output head, spread evenly over every block
    in the files (NextN/MTP blocks included, then left out as never loaded): MoE layers are alike, and the
    few dense lead layers are smaller, so the even spread slightly over-counts the first GPU.
    """
    arch = str(header_metadata.get("general.architecture"))
    n_layer_all = int(header_metadata.get(f"{arch}.block_count") or 0)
    nextn = int(header_metadata.get(f"{arch}.nextn_predict_layers") or 0)
    embd = first_shard_tensors.get("token_embd.weight", 0)
    output = first_shard_tensors.get("output.weight", embd)  # the head is the embedding's shape; shard 1 rarely holds it
    per_layer = max(total_bytes - embd - output, 0) // max(n_layer_all, 1)
    shape = Shape(label, arch, header_metadata, [per_layer] * (n_layer_all - nextn), embd, output,
                  per_layer * nextn, dict(tensor_types))
    shape.path, shape.files_bytes = path, total_bytes
    return shape


# --- estimate against what a server reported ------------------------------------------------------

_DEVICE = r"(\w+(?:\[[^\]\s]+\])?)"  # CUDA0, CPU_Mapped, or an RPC worker's RPC0[10.0.0.2:50052]
_LOGGED = {
    "model": re.compile(_DEVICE + r" model buffer size = +([\d.]+) MiB"),
    "kv": re.compile(_DEVICE + r" KV buffer size = +([\d.]+) MiB"),
    "compute": re.compile(_DEVICE + r" compute buffer size = +([\d.]+) MiB"),
    "output": re.compile(_DEVICE + r" +output buffer size = +([\d.]+) MiB"),
}


def logged_buffers(log_text: str) -> dict[str, dict[str, float]]:
    """llama-server's own buffer report, MiB per device: {"CUDA0": {"model":.., "kv":.., "compute":.., "output":..}}.

    KV lines are summed (DSA and DeepSeek-V4 caches print one line per sub-cache); model and compute lines
    of a device: the last one (a second graph reserve replaces the first).
    """
    out: dict[str, dict[str, float]] = {}
    for kind, pattern in _LOGGED.items():
        seen: dict[str, float] = {}
        for device, mib in pattern.findall(log_text):
            # CPU_Mapped / CPU: the device's own buffers; CPU_REPACK (a CPU-only re-layout of some weights) stays apart
            device = "CPU" if device in ("CPU", "CPU_Mapped") else device
            seen[device] = seen.get(device, 0.0) + float(mib) if kind in ("kv", "model") else float(mib)
        for device, mib in seen.items():
            out.setdefault(device, {"model": 0.0, "kv": 0.0, "compute": 0.0, "output": 0.0})[kind] = mib
    return out


def _pct(estimate: float, measured: float) -> float | None:
    return round(100.0 * (estimate - measured) / measured, 1) if measured else None


def estimate_vs_measured(shape: Shape, log_text: str, ctx: int, slots: int, n_gpus: int = 0, *,
                         used_mib: list[float] | None = None, type_k_bytes: float = 2.0) -> dict[str, Any]:
    """Our estimate beside llama-server's logged buffers (and nvidia-smi's used-minus-idle MiB per GPU, if given).

    ``n_gpus`` 0 is a CPU run: one device holding everything. Errors are (estimate - measured) / measured in %.
    """
    return estimate_vs_buffers(shape, logged_buffers(log_text), ctx, slots, n_gpus, used_mib=used_mib, type_k_bytes=type_k_bytes)


def estimate_vs_buffers(shape: Shape, logged: dict[str, dict[str, float]], ctx: int, slots: int, n_gpus: int = 0, *,
                        used_mib: list[float] | None = None, type_k_bytes: float = 2.0) -> dict[str, Any]:
    """:func:`estimate_vs_measured` on buffer sizes already parsed by :func:`logged_buffers` (e.g. a gpu-check result's)."""
    rows = []
    if n_gpus == 0:
        devices = per_device(shape, 1, ctx, slots, gpu=False, type_k_bytes=type_k_bytes)
        devices[0].weights += shape.input_bytes
        names = ["CPU"]
    else:
        devices = per_device(shape, n_gpus, ctx, slots, gpu=True, type_k_bytes=type_k_bytes)
        names = [f"CUDA{i}" for i in range(n_gpus)]
    for i, (name, d) in enumerate(zip(names, devices)):
        got = logged.get(name, {})
        logged_sum = sum(got.get(k, 0.0) for k in ("model", "kv", "compute", "output"))
        buffers = (d.weights + d.kv + d.compute) / MIB
        row = {
            "device": name,
            "estimate_mib": {"weights": round(d.weights / MIB, 1), "kv": round(d.kv / MIB, 1), "compute": round(d.compute / MIB, 1),
                             "overhead": round(d.overhead / MIB, 1), "total": round(d.total / MIB, 1)},
            "logged_mib": {k: round(v, 1) for k, v in got.items()},
            "error_pct": {"weights": _pct(d.weights / MIB, got.get("model", 0.0)), "kv": _pct(d.kv / MIB, got.get("kv", 0.0)),
                          "compute": _pct(d.compute / MIB, got.get("compute", 0.0)), "buffers": _pct(buffers, logged_sum)},
        }
        if used_mib is not None and i < len(used_mib):
            row["measured_used_mib"] = round(used_mib[i], 1)
            row["error_pct"]["total_vs_measured"] = _pct(d.total / MIB, used_mib[i])
        rows.append(row)
    if n_gpus and "CPU" in logged:
        rows.append({"device": "CPU (host)", "estimate_mib": {"weights": round(shape.input_bytes / MIB, 1)},
                     "logged_mib": {k: round(v, 1) for k, v in logged["CPU"].items()},
                     "error_pct": {"weights": _pct(shape.input_bytes / MIB, logged["CPU"].get("model", 0.0))}})
    errors = []
    for r in rows:
        if r["device"] == "CPU (host)":
            continue
        e = r["error_pct"].get("total_vs_measured", r["error_pct"]["buffers"])
        errors.append(None if e is None else abs(e))
    worst = None if not errors or None in errors else max(errors)  # a device with nothing measured is no pass
    return {"label": shape.label, "ctx_per_slot": ctx, "parallel": slots, "gpus": n_gpus, "devices": rows, "worst_error_pct": worst}
