"""`pyllm doctor`: can this box run this model, and how.

GPUs and driver (NVML), toolchain, this build and whether its CUDA code covers the GPUs;
with a model: architecture support, weight types and what sm_80 does with them, memory
from llama.cpp's own estimate (``llama-fit-params --fit-print``: model, context and
compute buffers per device), and a ready ``pyllm serve`` command or why it will not fit.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
from typing import Any

from .models.gguf_files import resolve_model
from .devices.gpus import GPU, driver, visible_gpus
from .llamacpp.native import binary, build_info
from .planning.roofline import weights_per_token
from .serve.options import DEFAULT_PARALLEL, DEFAULT_PREFILL_LANE

MARGIN_MIB = 1024  # free memory llama.cpp's --fit keeps per GPU by default

TYPE_NOTES = {
    "MXFP4": "FP4 (MXFP4): no FP4 tensor cores before sm_100; llama.cpp dequantizes in its MMQ/MMVQ kernels on sm_80",
    "NVFP4": "FP4 (NVFP4): no FP4 tensor cores before sm_100; this build runs them (CPU: vec_dot_nvfp4_q8_0; CUDA sm_80: "
             "dequantizing int8 MMQ/MMVQ kernels)",
    "BF16": "BF16: native on sm_80",
    "F16": "F16: native",
    "Q8_0": "Q8_0: int8 dot products (dp4a / MMQ) on sm_80",
}


@dataclasses.dataclass
class Finding:
    level: str  # "ok" | "warn" | "error"
    text: str


def _version(cmd: list[str], pattern: str) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(pattern, out)
    return m[1] if m else out.strip().splitlines()[0] if out.strip() else None


def toolchain() -> dict[str, str | None]:
    return {
        "nvcc": _version(["nvcc", "--version"], r"release ([\d.]+)"),
        "gcc": _version(["gcc", "-dumpfullversion"], r"([\d.]+)"),
        "cmake": _version(["cmake", "--version"], r"cmake version ([\d.]+)"),
    }


def coverage(gpu: GPU, archs: list[str]) -> Finding:
    numbers = sorted(int(re.match(r"\d+", a)[0]) for a in archs if re.match(r"\d+", a))
    sm = int(gpu.sm)
    if not numbers:
        return Finding("error", f"GPU {gpu.index} {gpu.name} (sm_{sm}): this is a CPU build; reinstall with -C cmake.define.GGML_CUDA=ON")
    if sm in numbers:
        return Finding("ok", f"GPU {gpu.index} {gpu.name} (sm_{sm}): native code in this build")
    if sm > numbers[0]:
        return Finding("warn", f"GPU {gpu.index} {gpu.name} (sm_{sm}): runs the sm_{numbers[-1]} PTX through JIT (slow first load); build \"{';'.join(map(str, numbers + [sm]))}\" for native code")
    return Finding("error", f"GPU {gpu.index} {gpu.name} (sm_{sm}): no code in this build (archs {numbers}); reinstall with -C cmake.define.CMAKE_CUDA_ARCHITECTURES=\"{sm}\"")


def fit_estimate(model_path: str, ctx: int, *, gpu_layers: int, tensor_split: list[float] | None = None,
                 env: dict[str, str] | None = None, parallel: int | None = None) -> dict[str, dict[str, int]]:
    """llama.cpp's own memory estimate, MiB per device: {"CUDA0": {"model":..,"context":..,"compute":..}, "Host": ...}."""
    args = [str(binary("llama-fit-params")), "-m", model_path, "-c", str(ctx), "--fit-print", "on", "-ngl", str(gpu_layers)]
    if parallel:
        args += ["-np", str(parallel)]
    if tensor_split:
        args += ["-ts", ",".join(f"{p:g}" for p in tensor_split)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"llama-fit-params failed: {result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else result.returncode}")
    estimate = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            estimate[parts[0]] = {"model": int(parts[1]), "context": int(parts[2]), "compute": int(parts[3])}
    return estimate


def model_report(spec: str, ctx: int | None, gpus: list[GPU], info: dict[str, Any]) -> tuple[dict[str, Any], list[Finding], str | None]:
    files = resolve_model(spec, check_arch=False)  # the architecture is judged below, not refused
    findings: list[Finding] = []
    arch = files.architecture
    meta = files.metadata
    known = arch in (info.get("architectures") or [])
    findings.append(Finding("ok" if known else "error",
                            f"architecture {arch}: " + ("supported by this build" if known else
                            f"unknown to this build ({info.get('llama_cpp_commit')}); build a newer llama.cpp with PYLLM_LLAMA_CPP_SOURCE")))
    for name, count in sorted(files.tensor_types.items(), key=lambda kv: -kv[1]):
        note = TYPE_NOTES.get(name)
        if note and name in ("MXFP4", "NVFP4"):
            findings.append(Finding("ok", f"{count} {name} tensors: {note}"))
    findings += [f for f in _nvfp4_findings(arch, files.tensor_types) if f.level != "ok"]
    if known:
        findings.append(_tensor_split_finding(arch, info))
        findings.append(_scheduling_finding(bool(gpus)))
    trained = int(meta.get(f"{arch}.context_length") or 0)
    asked = ctx
    ctx = ctx or (min(trained, 16384) if trained else 16384)
    report: dict[str, Any] = {
        "path": str(files.first), "shards": len(files.shards), "bytes": files.total_bytes, "architecture": arch,
        "supported": known, "layers": meta.get(f"{arch}.block_count"), "context_train": trained, "context": ctx,
        "tensor_types": files.tensor_types, "synthetic": bool(meta.get("pyllm.synthetic")),
    }
    suggestion = None
    if not known:
        return report, findings, suggestion
    try:
        host_only = fit_estimate(str(files.first), ctx, gpu_layers=0, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        report["estimate_cpu_mib"] = host_only
        context_mib = host_only.get("Host", {}).get("context", 0)
        findings.append(Finding("ok", f"KV cache and state for {ctx} tokens: {context_mib / 1024:.1f} GiB (llama.cpp's estimate)"))
    except Exception as exc:  # the estimate is advice; report why it is missing
        findings.append(Finding("warn", f"no memory estimate: {exc}"))
        return report, findings, suggestion
    if not gpus:
        findings.append(Finding("warn", "no GPU visible: the suggestion below runs on the CPU"))
        suggestion = f"pyllm serve {shlex.quote(str(files.first))}" + (f" --ctx-size {ctx}" if asked else "")
        findings.append(_capacity_finding(report, files, []))
        return report, findings, suggestion
    split = [1.0] * len(gpus)
    per_device = fit_estimate(str(files.first), ctx, gpu_layers=999, tensor_split=split, parallel=DEFAULT_PARALLEL)
    report["estimate_gpu_mib"] = per_device
    over = []
    for gpu in gpus:
        need = sum(per_device.get(f"CUDA{gpu.index}", {}).values())
        free = gpu.memory_free // 2**20
        if need + MARGIN_MIB > free:
            over.append(f"CUDA{gpu.index} needs {need / 1024:.1f} GiB, {free / 1024:.1f} GiB free")
    bandwidth = min((g.memory_bandwidth for g in gpus if g.memory_bandwidth), default=None)
    if bandwidth:  # layer split: the GPUs take turns, the slowest one's bandwidth bounds decode
        weights = weights_per_token(files)
        ceiling = weights.ceiling_tokens_per_second(bandwidth)
        report["decode_ceiling_tps"] = ceiling
        report["active_bytes_per_token"] = weights.active_bytes
        findings.append(Finding("ok", f"decode ceiling {ceiling:.0f} tokens/s ({weights.active_bytes / 1e9:.2f} GB of weights "
                                      f"per token at {bandwidth / 1e12:.2f} TB/s)"
                                      + ("; DeepSeek-V4 reached 12-14 % of it on H200s (docs/performance.md)" if arch == "deepseek4" else "")))
    total_vram = sum(g.memory_total for g in gpus)
    findings.append(Finding("ok" if files.total_bytes < total_vram else "error",
                            f"model {files.total_bytes / 2**30:.1f} GiB vs {total_vram / 2**30:.1f} GiB of VRAM on {len(gpus)} GPU(s)"))
    split_text = f"1x{len(gpus)}"
    if over:
        findings.append(Finding("error", "does not fit with all layers on GPU: " + "; ".join(over) +
                                ": lower --ctx-size, add GPUs, or use a smaller quantization"))
        suggestion = f"pyllm serve {shlex.quote(str(files.first))} --tensor-split {split_text} --ctx-size {max(2048, ctx // 4)}  # smaller context; llama.cpp --fit keeps the rest in RAM"
    else:
        suggestion = f"pyllm serve {shlex.quote(str(files.first))} --tensor-split {split_text}" + (f" --ctx-size {ctx}" if asked else "")
        findings.append(_capacity_finding(report, files, gpus))
    return report, findings, suggestion


# The families this package serves, by GGUF architecture: what doctor says tensor split allows among them.
SERVED_ARCHITECTURES = ("deepseek4", "glm-dsa", "deepseek32", "llama")
# Where llama.cpp allows tensor split and upstream reports it breaking (upstream issue, what users see).
TENSOR_SPLIT_UPSTREAM = {"deepseek4": "upstream reports a segfault with -sm tensor on DeepSeek-V4-Flash (ggml-org/llama.cpp#28826)"}


def _tensor_split_finding(arch: str, info: dict[str, Any]) -> Finding:
    """Whether --split-mode tensor is open to this architecture (the pin's own list), which of the served families the
    pin allows, whether NCCL is in, and what upstream reports against it."""
    refused = info.get("sm_tensor_unsupported")
    allowed = ""
    if refused is not None:
        served = [a for a in SERVED_ARCHITECTURES if a not in refused]
        allowed = f" (this llama.cpp allows it for {', '.join(served) or 'none'} of the served families)"
    if refused is not None and arch in refused:
        return Finding("ok", f"--split-mode tensor: not implemented for {arch} in this llama.cpp{allowed}; layer split "
                             "(the default) is used")
    nccl = ("with NCCL" if info.get("nccl") else "without NCCL (a slower all-reduce)") if info.get("cuda") else "needs a CUDA build"
    known = f"; {TENSOR_SPLIT_UPSTREAM[arch]}" if arch in TENSOR_SPLIT_UPSTREAM else ""
    return Finding("ok", f"--split-mode tensor: available for {arch} ({nccl}){allowed}; it needs flash attention and an "
                         f"f16/bf16/f32 KV cache, which pyllm serve checks; layer split stays the default{known}")


def _scheduling_finding(gpus: bool) -> Finding:
    """What pyllm serve does when one request's long prompt arrives while others decode (co-tenancy), on GPUs or on
    the CPU (serve/config.py: lane_threshold, min_chunk)."""
    from .serve.options import DEFAULT_BATCH_SIZE, DEFAULT_DECODE_LATENCY_TARGET

    where = (f"prompts of {DEFAULT_PREFILL_LANE:,}+ new tokens are prefilled in a lane beside the decoding streams "
             "(--prefill-lane; 0: off)" if gpus else
             "on the CPU every prompt step is a full batch (--prefill-min-chunk; small chunks run at half speed there) "
             "and no prefill lane (two contexts would share the same cores)")
    return Finding("ok", f"scheduling: pyllm serve keeps decoding streams at a token about every "
                         f"{DEFAULT_DECODE_LATENCY_TARGET} ms while other prompts are prefilled (--decode-latency-target; "
                         f"0: llama.cpp's own, where a long prompt stalls them), prompt steps of at most "
                         f"{DEFAULT_BATCH_SIZE} tokens (--batch-size); {where}")


def _capacity_finding(report: dict[str, Any], files: Any, gpus: list[GPU]) -> Finding:
    """The KV pool and slots pyllm serve would plan on these GPUs (planning/capacity.py), as serve prints it."""
    from .planning import capacity
    from .planning.memplan import local_shape

    if gpus:
        budget = capacity.Budget.gpus([g.memory_total for g in gpus], [g.memory_total - g.memory_free for g in gpus])
    else:
        import psutil

        budget = capacity.Budget.cpu(psutil.virtual_memory().available)
    plan = capacity.plan_default_lane(local_shape(files), budget, DEFAULT_PREFILL_LANE if gpus else 0)  # as serve does
    report["plan"] = plan.as_dict()
    if not plan.fits:
        return Finding("warn", f"no KV pool fits beside the weights ({budget.rule}): llama.cpp's --fit decides")
    return Finding("ok", f"pyllm serve's plan: {plan.summary()}")


def rpc_report(spec: str) -> list[dict[str, Any]]:
    """Each rpc-server worker: its protocol version and devices with memory (asked as llama.cpp's client asks)."""
    from .rpc.devices import worker_devices
    from .rpc.protocol import parse_endpoints, probe

    workers = []
    for endpoint in parse_endpoints(spec):
        worker = probe(endpoint)
        devices = [{k: v for k, v in dataclasses.asdict(d).items() if k != "gpu"} for d in worker_devices([worker])]
        workers.append({"endpoint": str(endpoint), "version": ".".join(map(str, worker.version)), "devices": devices})
    return workers


def gather(model: str | None = None, ctx_size: int | None = None, rpc: str | None = None) -> dict[str, Any]:
    info = build_info()
    gpus = visible_gpus()
    drv = driver()
    findings: list[Finding] = []
    archs = info.get("cuda_architectures") or []
    for gpu in gpus:
        findings.append(coverage(gpu, archs))
        if gpu.mig_enabled:
            findings.append(Finding("warn", f"GPU {gpu.index} has MIG enabled: llama.cpp sees MIG slices, not the whole GPU"))
    if drv and info.get("cuda_version") and tuple(map(int, info["cuda_version"].split("."))) > tuple(map(int, drv.cuda_version.split("."))):
        findings.append(Finding("error", f"this build's CUDA {info['cuda_version']} is newer than the driver's {drv.cuda_version}: upgrade the driver or rebuild with an older toolkit"))
    report: dict[str, Any] = {
        "gpus": [dataclasses.asdict(g) for g in gpus],
        "driver": dataclasses.asdict(drv) if drv else None,
        "toolchain": toolchain(),
        "build": {k: info.get(k) for k in ("version", "llama_cpp_commit", "source", "cuda", "cuda_version", "cuda_architectures", "patches")},
    }
    if rpc is not None:  # an empty --rpc is refused (parse_endpoints), not skipped
        report["rpc"] = rpc_report(rpc)
    suggestion = None
    if model is not None:
        report["model"], model_findings, suggestion = model_report(model, ctx_size, gpus, info)
        findings += model_findings
    report["findings"] = [dataclasses.asdict(f) for f in findings]
    report["suggestion"] = suggestion
    return report


# --- memory plan (pyllm doctor MODEL --gpus 8x80) ----------------------------------------------

NVFP4_NOTE = ("NVFP4 on this build: CPU ggml-cpu vec_dot_nvfp4_q8_0; CUDA sm_80 dequantizing int8 paths "
              "(MMQ generic NVFP4 tiles, MMVQ vec_dot_nvfp4_q8_1); native FP4 only on sm_100+")


def _source(model: str) -> str:
    """"preset", "file" or "hub": a synth preset name, something on this disk (or fetched), else OWNER/NAME on a hub."""
    from .errors import ModelNotFound
    from .models.gguf_files import locate
    from .synth import PRESETS

    if model in PRESETS:
        return "preset"
    try:
        locate(model)
        return "file"
    except ModelNotFound:
        if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", model) and not model.endswith(".gguf"):
            return "hub"  # OWNER/NAME; ./x.gguf or dir/x.gguf that do not exist stay "no such file"
        raise


def _nvfp4_findings(arch: str, types: dict[str, int]) -> list[Finding]:
    count = types.get("NVFP4", 0)
    if not count:
        return []
    out = [Finding("ok", f"{count} NVFP4 tensors: {NVFP4_NOTE}")]
    from .synth import NVFP4_SCALED_ARCHS

    if arch not in NVFP4_SCALED_ARCHS and arch != "llama":
        out.append(Finding("error", f"{arch} at this llama.cpp pin never applies NVFP4's per-expert scale_2 (ffn_*_exps.scale): "
                                    "the model would load and answer wrong; use an MXFP4 or Q8_0 GGUF of it"))
    return out


def hub_shapes(repo: str, *, token: str | None = None, revision: str | None = None) -> list:
    """One memplan.Shape per GGUF shard set in a hub repo: sizes from the listing, hparams from shard 1's header."""
    from .models.fetch import is_sidecar, list_remote, quant_of, shard_sets
    from .models.gguf_remote import remote_header
    from .planning.memplan import hub_shape

    commit, files = list_remote(repo, revision=revision, token=token)
    sizes = {f.path: f.size for f in files}
    sets = shard_sets([f.path for f in files])
    sets = {first: members for first, members in sets.items()
            if not (is_sidecar(first) or first.rsplit("/", 1)[-1].lower().startswith("mmproj"))}  # drafts, vision towers
    if not sets:
        from .errors import RepoNotFound

        raise RepoNotFound(f"{repo} holds no .gguf file: give a GGUF repo (e.g. unsloth/GLM-5-GGUF) or a preset name")
    shapes = []
    for first, members in sets.items():
        header = remote_header(repo, first, revision=commit, token=token)
        label = quant_of(first) or first.rsplit("/", 1)[-1].removesuffix(".gguf")
        shapes.append(hub_shape(label, header.metadata, header.tensor_bytes, sum(sizes[m] for m in members),
                                header.tensor_types, f"{repo}:{label}"))
    return shapes


def plan_gpus(gpus: str) -> tuple[Any, list[int] | None]:
    """doctor --gpus: ``8x80`` plans for GPUs that need not be here (COUNTxGIB); ``0-3``, ``4-7``, ``2`` (serve --gpus's
    form, nvidia-smi numbers) plans for those GPUs of this machine: their count and the smallest one's memory (NVML)."""
    from .planning.memplan import GpuSpec, parse_gpus

    if not re.fullmatch(r"[\d\s,-]+", gpus or ""):
        return parse_gpus(gpus), None
    from .devices.gpus import nvml_gpus, select_gpus

    chosen = select_gpus(gpus, nvml_gpus())
    gib = min(g.memory_total for g in chosen) / 2**30
    return GpuSpec(len(chosen), round(gib, 1)), [g.physical_index for g in chosen]


def _plan_budget(spec: Any, devices: list[int] | None) -> Any:
    """What pyllm serve would plan against: these GPUs of this machine as NVML sees them now, or COUNTxGIB empty."""
    from .planning.capacity import Budget

    if devices is not None:
        from .devices.gpus import nvml_gpus

        here = [g for g in nvml_gpus() if g.physical_index in devices]
        return Budget.gpus([g.memory_total for g in here], [g.memory_total - g.memory_free for g in here])
    return Budget.gpus([spec.bytes_each] * spec.count)


def _capacity_row(shape: Any, target: str, spec: Any, budget: Any, slots: int) -> tuple[Any, Any]:
    """A memory-plan row at the capacity plan's pool (planning/capacity.py) and that plan; the serve command needs no
    --ctx-per-slot or --parallel: serve plans the same."""
    from .planning import capacity
    from .planning.memplan import plan_row

    plan = capacity.plan_default_lane(shape, budget, DEFAULT_PREFILL_LANE, slots=None if slots == DEFAULT_PARALLEL else slots)
    row = plan_row(shape, target, spec, *plan.streams)
    row.fits = plan.fits
    split = f" --tensor-split 1x{spec.count}" if spec.count > 1 else ""
    row.serve = (f"pyllm serve {shlex.quote(str(target))}{split}" + ("" if slots == DEFAULT_PARALLEL else f" --parallel {slots}")
                 if plan.fits else None)
    row.note = plan.summary() if plan.fits else (row.note or f"no KV pool fits ({plan.budget.rule})")
    row.capacity = plan.as_dict()
    return row, plan


def memory_plan(model: str, gpus: str, ctx_size: int | None = None, parallel: int | None = None, *,
                layers: int | None = None, experts: int | None = None, token: str | None = None) -> dict[str, Any]:
    """Per quantization: weights, KV at ctx x slots, compute, per-GPU total, fits, and a serve command that fits."""
    from .errors import InvalidArgument
    from .planning.memplan import CUDA_OVERHEAD_MIB, FIT_MARGIN_MIB, local_shape, plan_row, preset_shapes

    spec, devices = plan_gpus(gpus)
    slots = (1 if ctx_size is not None else DEFAULT_PARALLEL) if parallel is None else parallel
    if slots < 1:
        raise InvalidArgument(f"--parallel {parallel}: must be at least 1 (request slots served at once)")
    if ctx_size is not None and ctx_size < 1:
        raise InvalidArgument(f"--ctx-per-slot {ctx_size}: must be a positive number of tokens per slot (e.g. 131072)")
    source = _source(model)
    findings: list[Finding] = []
    fit = None
    if source == "preset":
        shapes = preset_shapes(model, layers=layers, experts=experts)
    elif source == "file":
        if layers is not None or experts is not None:
            raise InvalidArgument("--layers/--experts shape a preset; a file has its own (drop them)")
        files = resolve_model(model, check_arch=False)
        shapes = [local_shape(files)]
    else:
        shapes = hub_shapes(model, token=token)
    first = shapes[0]
    trained = int(first.get("context_length") or 0)
    if ctx_size and trained and ctx_size > trained:
        raise InvalidArgument(f"--ctx-per-slot {ctx_size}: more than {model}'s trained context ({trained} tokens per sequence); "
                              f"plan for at most {trained}")
    ctx = ctx_size or (min(trained, 16384) if trained else 16384)
    model_arg = model if source != "hub" else None
    rows = []
    plans: list[Any] = []
    budget = _plan_budget(spec, devices)
    for shape in shapes:
        # a preset's row names the file `pyllm synth MODEL -o MODEL-TYPE.gguf --type TYPE` writes
        target = f"{model}-{shape.label}.gguf" if source == "preset" else (model_arg or shape.path)
        if ctx_size is None:  # the plan pyllm serve makes: the slots, each up to the trained context, the pool from memory
            row, plan = _capacity_row(shape, target, spec, budget, slots)
            plans.append(plan)
        else:
            row = plan_row(shape, target, spec, ctx, slots)
        if devices is not None and row.serve:
            from .devices.gpus import format_gpu_list

            row.serve += f" --gpus {format_gpu_list(devices)}"
        rows.append(row)
        for f in _nvfp4_findings(shape.arch, shape.tensor_types):
            findings.append(Finding(f.level, f"{shape.label}: {f.text}"))
    if source == "file":
        try:  # llama.cpp's own figure: on a CUDA build with these GPUs per device, else the host-only one
            info = build_info()
            gpus_here = visible_gpus()
            if info.get("cuda") and devices is not None:  # those GPUs, as serve --gpus shows them to llama-server
                from .devices.gpus import child_env

                fit = fit_estimate(str(shapes[0].path), ctx * slots, gpu_layers=999, tensor_split=[1.0] * spec.count,
                                   parallel=slots, env=child_env(devices))
            elif info.get("cuda") and len(gpus_here) >= spec.count:
                fit = fit_estimate(str(shapes[0].path), ctx * slots, gpu_layers=999, tensor_split=[1.0] * spec.count, parallel=slots)
            else:
                fit = fit_estimate(str(shapes[0].path), ctx * slots, gpu_layers=0, parallel=slots,
                                   env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
            rows[0].llama_fit_mib = fit
        except Exception as exc:  # advice: say why it is missing
            findings.append(Finding("warn", f"no llama-fit-params figure: {exc}"))
    if plans:  # the slots and context of the first quantization that fits (else the first)
        chosen = next((c for c in plans if c.fits), plans[0])
        ctx, total = chosen.per_slot, chosen.pool
    else:
        total = ctx * slots
    return {
        "model": model, "source": source, "architecture": first.arch, "gpus": {"count": spec.count, "gib": spec.gib, "devices": devices},
        "ctx_per_slot": ctx, "parallel": slots, "ctx_total": total, "context_train": trained,
        "planned": bool(plans), "budget": budget.rule if plans else None,
        "cuda_overhead_mib": CUDA_OVERHEAD_MIB, "fit_margin_mib": FIT_MARGIN_MIB,
        "rows": [r.as_dict() for r in rows],
        "findings": [dataclasses.asdict(f) for f in findings],
    }
