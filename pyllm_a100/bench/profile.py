"""`pyllm bench MODEL --profile`: the kernels of one decode step, timed by Nsight Compute per CUDA graph node.

llama-bench generates 1 token and then 2 tokens under ``ncu --graph-profiling node --metrics
gpu__time_duration.sum``; what the second run launched beyond the first is one decode step (the load,
the warm-up and the prompt-free setup cancel). nsys does not work on the GPU machine; ncu does.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import PyllmError
from .decode_results import kernel_family

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


def kernel_table(text: str) -> dict[str, tuple[int, float]]:
    """ncu's ``--csv`` output -> kernel name: (launches, microseconds)."""
    start = text.find('"ID"')
    if start < 0:
        raise ProfileError("ncu printed no kernel table (no CSV header): was the GPU visible, and did llama-bench run?")
    table: dict[str, tuple[int, float]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != METRIC:
            continue
        scale = UNITS_US.get((row.get("Metric Unit") or "nsecond").lower(), 1e-3)
        count, us = table.get(row["Kernel Name"], (0, 0.0))
        table[row["Kernel Name"]] = (count + 1, us + float(row["Metric Value"].replace(",", "")) * scale)
    return table


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
    from ..build.native import binary
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
            cmd = [ncu, "--graph-profiling", "node", "--metrics", METRIC, "--csv", "--print-units", "base", "--log-file", str(log),
                   str(bench), "-m", str(files.first), "-p", "0", "-n", str(n), "-r", "1", "--no-warmup", *extra_args]
            result = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, CUDA_CACHE_MAXSIZE="4294967296"))
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.returncode}"]
                raise ProfileError(f"ncu on llama-bench failed ({tail[0]}): run the command by hand to see why: {' '.join(cmd)}")
            tables.append(kernel_table(log.read_text(errors="replace") if log.exists() else result.stdout))
    return StepProfile(str(files.first), one_step(*tables))
