"""`pyllm bench MODEL --profile`: the kernels of one decode step, timed by Nsight Compute per CUDA graph node.

llama-bench generates 1 token and then 2 tokens under ``ncu --graph-profiling node --metrics
gpu__time_duration.sum``; what the second run launched beyond the first is one decode step (the load,
the warm-up and the prompt-free setup cancel). nsys does not work on the GPU machine; ncu does.

ncu flushes the GPU's caches before each kernel unless told otherwise (``--cache-control all``), which
makes a small kernel pay DRAM latency for inputs the kernel before it has just written: measured on an
H200 (docs/performance.md), one-token attention took ~23 us per layer that way and ~12 us warm. So
``--profile`` keeps the caches as the previous kernel left them (``--cache-control none``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..errors import PyllmError

GGML_TYPES = {"8": "Q8_0", "39": "MXFP4", "2": "Q4_0", "1": "F16", "0": "F32"}


def kernel_family(name: str) -> str:
    """``void mul_mat_vec_q<39, 1, 1, 0, 0>(...)`` -> ``mul_mat_vec_q MXFP4 (ids)``; other kernels by their base name."""
    base = re.split(r"[<(]", name.replace("void ", ""), maxsplit=1)[0]
    m = re.match(r"mul_mat_vec_q<(\d+), *\d+, *(\d+)", name.replace("void ", ""))
    if m:
        return f"{base} {GGML_TYPES.get(m[1], 'type ' + m[1])}" + (" (experts)" if m[2] == "1" else "")
    return base


METRIC = "gpu__time_duration.sum"
UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


class ProfileError(PyllmError, RuntimeError):
    """``ncu (Nsight Compute) is not on PATH: install it, or add its folder to PATH``"""


@dataclasses.dataclass(frozen=True)
class KernelRow:
    family: str  # the kernel's base name, mul_mat_vec_q with its type
    count: int
    us: float


@dataclasses.dataclass(frozen=True)
class StepProfile:
    model: str
    rows: list[KernelRow]  # one decode step, slowest family first

    @property
    def kernels(self) -> int:
        return sum(r.count for r in self.rows)

    @property
    def us(self) -> float:
        return round(sum(r.us for r in self.rows), 1)

    def as_row(self) -> dict:
        return {"model": self.model, "kernels_per_step": self.kernels, "kernel_us_per_step": self.us,
                "kernels": [dataclasses.asdict(r) for r in self.rows]}


def kernel_table(text: str, by_launch: bool = False) -> dict[str, tuple[int, float]]:
    """ncu's ``--csv`` output -> kernel name (``by_launch``: with its grid and block): (launches, microseconds)."""
    start = text.find('"ID"')
    if start < 0:
        raise ProfileError("ncu printed no kernel table (no CSV header): was the GPU visible, and did llama-bench run?")
    table: dict[str, tuple[int, float]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != METRIC:
            continue
        scale = UNITS_US.get((row.get("Metric Unit") or "nsecond").lower(), 1e-3)
        key = f"{row['Kernel Name']} grid{row.get('Grid Size', '')} block{row.get('Block Size', '')}" if by_launch else row["Kernel Name"]
        count, us = table.get(key, (0, 0.0))
        table[key] = (count + 1, us + float(row["Metric Value"].replace(",", "")) * scale)
    return table


# What holds a kernel (ncu per launch, kernel replay): a profiling run asks for these by name and
# for the stall reasons by pattern; four sections of the details page are the fallback when a name is unknown to that ncu.
LAUNCH_METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                  "sm__throughput.avg.pct_of_peak_sustained_elapsed", "l1tex__throughput.avg.pct_of_peak_sustained_active",
                  "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
                  "launch__occupancy_limit_registers", r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
STALL = "smsp__average_warps_issue_stalled_"


def launch_metrics(text: str) -> dict[str, dict[str, dict[str, float]]]:
    """ncu's long ``--csv`` output (a row per launch and metric) -> launch shape: metric: mean over its launches.

    A shape is the kernel's name up to its argument list plus its grid; stall reasons (``STALL``*) are folded into a
    ``stalls`` entry holding the six largest."""
    start = text.find('"ID"')
    if start < 0:
        raise ProfileError("ncu printed no metric table (no CSV header): was the GPU visible, and did llama-bench run?")
    per_launch: dict[tuple[str, str], dict[str, float]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        try:
            value = float((row.get("Metric Value") or "").replace(",", ""))
        except ValueError:
            continue
        shape = f"{row.get('Kernel Name', '').split('(')[0]} grid{row.get('Grid Size', '')}"
        per_launch.setdefault((shape, row["ID"]), {})[row["Metric Name"]] = value
    out: dict[str, dict] = {}
    for (shape, _), metrics in per_launch.items():
        acc = out.setdefault(shape, {"launches": 0, "sums": {}})
        acc["launches"] += 1
        for name, v in metrics.items():
            acc["sums"][name] = acc["sums"].get(name, 0.0) + v
    for shape, acc in out.items():
        means = {k: round(v / acc["launches"], 3) for k, v in acc.pop("sums").items()}
        stalls = {k[len(STALL):].split("_per_issue")[0]: v for k, v in means.items() if k.startswith(STALL)}
        acc.update({k: v for k, v in means.items() if not k.startswith(STALL)})
        if stalls:
            acc["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:6])
    return dict(sorted(out.items(), key=lambda kv: -kv[1].get("gpu__time_duration.sum", kv[1].get("Duration", 0)) * kv[1]["launches"]))


def one_step(first: dict[str, tuple[int, float]], second: dict[str, tuple[int, float]]) -> list[KernelRow]:
    """What ``second`` (2 tokens) ran beyond ``first`` (1 token), by kernel family, slowest first."""
    families: dict[str, list[float]] = {}
    for name, (count, us) in second.items():
        c1, us1 = first.get(name, (0, 0.0))
        if count - c1 > 0:
            fam = families.setdefault(kernel_family(name), [0, 0.0])
            fam[0] += count - c1
            fam[1] += us - us1
    return sorted((KernelRow(f, int(c), round(us, 1)) for f, (c, us) in families.items()), key=lambda r: -r.us)


def profile_decode_step(model: str | os.PathLike[str], *, llama_bench: Path | None = None,
                        extra_args: tuple[str, ...] = ("-ngl", "99", "-fa", "1")) -> StepProfile:
    from ..llamacpp.native import binary
    from ..models.gguf_files import resolve_model

    ncu = shutil.which("ncu")
    if ncu is None:
        raise ProfileError("--profile needs ncu (Nsight Compute) on PATH, and a CUDA build with a GPU: install the CUDA "
                           "toolkit's nsight-compute, or add its folder (e.g. /usr/local/cuda/bin) to PATH")
    files = resolve_model(model)
    bench = llama_bench or binary("llama-bench")
    tables = []
    with tempfile.TemporaryDirectory(prefix="pyllm-profile-") as tmp:
        for n in (1, 2):
            log = Path(tmp) / f"n{n}.csv"
            cmd = [ncu, "--graph-profiling", "node", "--cache-control", "none", "--metrics", METRIC,
                   "--csv", "--print-units", "base", "--log-file", str(log),
                   str(bench), "-m", str(files.first), "-p", "0", "-n", str(n), "-r", "1", "--no-warmup", *extra_args]
            result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, CUDA_CACHE_MAXSIZE="4294967296"))
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.returncode}"]
                raise ProfileError(f"ncu on llama-bench failed ({tail[0]}): run the command by hand to see why: {' '.join(cmd)}")
            tables.append(kernel_table(log.read_text(errors="replace") if log.exists() else result.stdout))
    return StepProfile(str(files.first), one_step(*tables))


def profile_launches(llama_bench: Path, model: str | os.PathLike[str], log_dir: Path, *, env: dict[str, str],
                     kernels: str = "regex:mul_mat_vec_q", count: int = 80,
                     extra_args: tuple[str, ...] = ("-ngl", "99", "-fa", "1")) -> dict:
    """ncu per launch (kernel replay, CUDA graphs off) on one ``-n 1`` llama-bench run: ``launch_metrics`` of the
    first ``count`` launches matching ``kernels``, with LAUNCH_METRICS, or with four sections of the details page (their
    metrics by display name) when that ncu rejects a name. Returns {"how": "metrics" | "sections", "shapes": ...}; the
    CSV files stay in ``log_dir``."""
    tried = []
    sections = [arg for name in ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats") for arg in ("--section", name)]
    for how, what in (("metrics", ["--metrics", ",".join(LAUNCH_METRICS)]), ("sections", sections)):
        log = Path(log_dir) / f"ncu-launches-{how}.csv"
        cmd = ["ncu", *what, "-k", kernels, "--launch-count", str(count), "--csv", "--print-units", "base",
               "--log-file", str(log), str(llama_bench), "-m", str(model), "-p", "0", "-n", "1", "-r", "1",
               "--no-warmup", *extra_args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                                env={**os.environ, "CUDA_CACHE_MAXSIZE": "4294967296", "GGML_CUDA_DISABLE_GRAPHS": "1", **env})
        (Path(log_dir) / f"ncu-launches-{how}.stdout").write_text(result.stdout + result.stderr)
        try:
            return {"how": how, "shapes": launch_metrics(log.read_text(errors="replace") if log.exists() else "")}
        except ProfileError as e:
            tried.append(f"{how}: exit {result.returncode}, {e}")
    raise ProfileError(f"ncu per-launch metrics failed ({'; '.join(tried)}): see {log_dir}/ncu-launches-*.stdout")


def forward_difference(first: dict[str, dict[str, list]], second: dict[str, dict[str, list]]) -> dict[str, Any]:
    """A profiling run's step: what run ``second`` (one more forward) launched beyond ``first``, per kernel
    name and per launch shape ({kind: {kernel: [count, us]}} each, from kernel_table), slowest first, with totals."""
    out: dict[str, Any] = {}
    for kind in ("name", "launch"):
        diff = {}
        for k, (c, us) in second.get(kind, {}).items():
            c1, us1 = first.get(kind, {}).get(k, (0, 0.0))
            if c - c1:
                diff[k] = {"count": c - c1, "total_us": round(us - us1, 2)}
        out[kind] = dict(sorted(diff.items(), key=lambda kv: -kv[1]["total_us"]))
    out["kernels_per_forward"] = sum(v["count"] for v in out["name"].values())
    out["kernel_us_per_forward"] = round(sum(v["total_us"] for v in out["name"].values()), 1)
    out["raw_counts"] = {"n1": sum(c for c, _ in first["name"].values()), "n2": sum(c for c, _ in second["name"].values())}
    return out


def ncu_kernel_tables(tool: list[str], report: str, *, env: dict[str, str], cache_control: str = "all") -> dict[str, dict[str, list]]:
    """``ncu --graph-profiling node`` over one program run (a profiling run's step): kernel_table by kernel
    name and by launch shape. The CSV lands in ``report`` (ncu's --log-file), stdout in ``report``.stdout."""
    cmd = ["ncu", "--graph-profiling", "node", "--cache-control", cache_control, "--metrics", "gpu__time_duration.sum",
           "--csv", "--print-units", "base", "--log-file", report, *tool]
    with open(report + ".stdout", "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=1200, env=env).returncode
    texts = (open(x, errors="replace").read() for x in (report, report + ".stdout") if os.path.exists(x))
    text = next((t for t in texts if '"ID"' in t), "")
    if rc or '"ID"' not in text:
        raise ProfileError(f"ncu over {os.path.basename(tool[0])} rc={rc}: see {report}.stdout")
    return {kind: {k: list(v) for k, v in kernel_table(text, by_launch=kind == "launch").items()} for kind in ("name", "launch")}
