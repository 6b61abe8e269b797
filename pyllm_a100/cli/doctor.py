"""This machine and this build: doctor (with its memory plan), build-info."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from .common import MODEL_HELP, JsonFlag, OldCtxPerSlot, out, per_slot_context


def build_info_cmd(as_json: JsonFlag = False) -> None:
    """What was built: llama.cpp commit and source, CUDA version and architectures, paths."""
    from ..llamacpp.native import build_info

    info = build_info()
    if as_json:
        out.print_json(json.dumps(info)) if sys.stdout.isatty() else print(json.dumps(info, indent=2))
        return
    archs = ",".join(info["cuda_architectures"]) or "-"
    rows = [
        ("pyllm-a100", info["version"]),
        ("llama.cpp", f"{info['llama_cpp_commit']} ({info['source']})"),
        ("patches", ", ".join(info["patches"]) or "none"),
        ("CUDA", f"{info['cuda_version']} for sm {archs}" if info["cuda"] else "no (CPU build)"),
        ("NCCL", "-" if not info["cuda"] else "yes" if info.get("nccl") else "no (--split-mode tensor falls back to a slower all-reduce)"),
        ("web UI", "unknown (built before build info said)" if "ui" not in info else info.get("ui_detail") or ("yes" if info["ui"] else "no")),
        ("compiler", info["compiler"]),
        ("native dir", info["native_dir"]),
        ("llama-server", info["server_path"]),
    ]
    for key, value in rows:
        print(f"{key:>12}  {value}")


def doctor_cmd(
    model: Annotated[Optional[str], typer.Argument(help=MODEL_HELP[:-1] + "; with --gpus also a preset (glm-5, deepseek-v4-flash) or a hub repo, read by metadata only.")] = None,
    ctx_per_slot: Annotated[Optional[int], typer.Option("--ctx-per-slot", help="Tokens each request slot holds, to plan for "
                                                        "(default: the model's context, at most 16384).")] = None,
    ctx_size: OldCtxPerSlot = None,
    rpc: Annotated[Optional[str], typer.Option(help="Also list these rpc-server workers' devices (HOST:PORT[,...]).")] = None,
    gpus: Annotated[Optional[str], typer.Option(help="Plan memory for COUNTxGIB GPUs (e.g. 8x80), or for GPUs of this machine "
                                                "by number as serve --gpus takes them (0-3): per quantization, weights, "
                                                "KV, compute per GPU, fits or not, and a serve command. MODEL may be a preset "
                                                "(glm-5, deepseek-v4-flash), a file, or a hub repo (read by metadata only).")] = None,
    parallel: Annotated[Optional[int], typer.Option(help="With --gpus: request slots, each of --ctx-per-slot tokens.")] = None,
    layers: Annotated[Optional[int], typer.Option(help="With --gpus and a preset: cut the preset to N layers.")] = None,
    experts: Annotated[Optional[int], typer.Option(help="With --gpus and a preset: routed experts per layer.")] = None,
    token: Annotated[Optional[str], typer.Option(help="With --gpus and a hub repo: access token (or HF_TOKEN).", envvar="HF_TOKEN")] = None,
    as_json: JsonFlag = False,
) -> None:
    """GPUs, driver, toolchain and this build; with MODEL: support, memory fit and a serve command."""
    from ..doctor import gather

    ctx_size = per_slot_context(ctx_per_slot, ctx_size, "doctor")
    if gpus is not None or parallel is not None:
        _memory_plan(model, gpus, ctx_size, parallel, layers, experts, token, as_json)
        return
    report = gather(model, ctx_size, rpc=rpc)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    if report["gpus"]:
        for g in report["gpus"]:
            mig = ", MIG on" if g["mig_enabled"] else ""
            print(f"GPU {g['index']}: {g['name']} sm_{g['compute_capability'].replace('.', '')}, "
                  f"{g['memory_total'] / 2**30:.0f} GiB ({g['memory_free'] / 2**30:.0f} GiB free){mig}")
    else:
        print("GPUs: none visible (no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them)")
    for w in report.get("rpc", []):
        devices = ", ".join(f"{d['description']} {d['total_mib'] / 1024:.1f} GiB ({d['free_mib'] / 1024:.1f} free)" for d in w["devices"]) or "-"
        print(f"rpc {w['endpoint']}: RPC {w['version']}, {devices}")
    d = report["driver"]
    print(f"driver: {d['version']} (CUDA <= {d['cuda_version']})" if d else "driver: not found")
    t = report["toolchain"]
    print(f"toolchain: nvcc {t['nvcc'] or '-'}, gcc {t['gcc'] or '-'}, cmake {t['cmake'] or '-'}")
    b = report["build"]
    archs = ",".join(b["cuda_architectures"] or []) or "-"
    print(f"build: llama.cpp {b['llama_cpp_commit']} ({b['source']}), " + (f"CUDA {b['cuda_version']} sm {archs}" if b["cuda"] else "CPU only"))
    m = report.get("model")
    if m:
        print(f"model: {m['path']} ({m['architecture']}, {m['layers']} layers, {m['shards']} file(s), {m['bytes'] / 2**30:.2f} GiB"
              + (", synthetic" if m["synthetic"] else "") + ")")
        print("  types: " + ", ".join(f"{n} x{c}" for n, c in sorted(m["tensor_types"].items(), key=lambda kv: -kv[1])))
    marks = {"ok": "ok  ", "warn": "warn", "error": "FAIL"}
    for f in report["findings"]:
        print(f"[{marks[f['level']]}] {f['text']}")
    if report["suggestion"]:
        print(f"suggested: {report['suggestion']}")
    if any(f["level"] == "error" for f in report["findings"]):
        sys.exit(1)


def _memory_plan(model: Optional[str], gpus: Optional[str], ctx_size: Optional[int], parallel: Optional[int],
                 layers: Optional[int], experts: Optional[int], token: Optional[str], as_json: bool) -> None:
    from rich.table import Table

    from ..doctor import memory_plan
    from ..errors import InvalidArgument

    if model is None or gpus is None:
        raise InvalidArgument("the memory plan needs a MODEL and --gpus COUNTxGIB (or GPUs of this machine, such as 0-3), "
                              "e.g. pyllm doctor glm-5 --gpus 8x80 --ctx-size 131072 --parallel 4")
    plan = memory_plan(model, gpus, ctx_size, parallel, layers=layers, experts=experts, token=token)
    if as_json:
        print(json.dumps(plan, indent=2))
        return
    g = plan["gpus"]
    out = Console(highlight=False, soft_wrap=False, width=max(Console().width, 140))
    from ..devices.gpus import format_gpu_list

    where = "" if not g.get("devices") else f" (GPUs {format_gpu_list(g['devices'])} of this machine)"
    out.print(f"{plan['model']} ({plan['architecture']}, {plan['source']}) on {g['count']} x {g['gib']:g} GiB{where}: "
              f"{plan['ctx_per_slot']} tokens per slot x {plan['parallel']} slot(s); per GPU under an even layer split, "
              f"+{plan['cuda_overhead_mib']} MiB CUDA overhead, {plan['fit_margin_mib']} MiB kept free")
    table = Table(show_edge=False, pad_edge=False)
    for name, justify in (("quant", "left"), ("weights GiB", "right"), ("KV GiB", "right"), ("compute GiB", "right"),
                          ("max/GPU GiB", "right"), ("fits", "left"), ("note", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for r in plan["rows"]:
        table.add_row(r["label"], f"{r['weight_bytes'] / 2**30:.1f}", f"{r['kv_bytes'] / 2**30:.2f}",
                      f"{r['compute_bytes'] / 2**30:.2f}", f"{r['max_device_bytes'] / 2**30:.1f}",
                      "yes" if r["fits"] else "no", r["note"])
    out.print(table)
    for r in plan["rows"]:  # whole lines, never wrapped: they are meant to be pasted
        if r["serve"]:
            print(f"{r['label']}: {r['serve']}")
    for r in plan["rows"]:
        if r.get("llama_fit_mib"):
            ours = {d["device"]: d for d in r["devices"]}
            for dev, f in r["llama_fit_mib"].items():
                if dev in ours:
                    d = ours[dev]
                    mine = (d["weights"], d["kv"], d["compute"])
                elif dev == "Host":  # a host-only figure: the whole model on one device
                    mine = (r["weight_bytes"], r["kv_bytes"], max(d["compute"] for d in r["devices"]))
                else:
                    continue
                out.print(f"{r['label']} {dev}: llama-fit-params model {f['model']}, context {f['context']}, compute {f['compute']} MiB; "
                          f"this plan {mine[0] / 2**20:.0f}, {mine[1] / 2**20:.0f}, {mine[2] / 2**20:.0f} MiB", markup=False)
    for f in plan["findings"]:
        out.print(f"[{ {'ok': 'ok  ', 'warn': 'warn', 'error': 'FAIL'}[f['level']] }] {f['text']}", markup=False)
