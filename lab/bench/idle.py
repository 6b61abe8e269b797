"""How much of the GPU a decode step leaves idle (issue 55 item 3, "measure first"): ncu over one llama-bench decode
step and one prompt chunk, per kernel launch (CUDA graph nodes one by one), with the metrics that say how busy the
SMs were, and the step's totals weighted by each kernel's duration.

Per launch: duration (gpu__time_duration.sum), SM throughput (sm__throughput, % of peak), achieved occupancy
(sm__warps_active, % of peak while active), the share of the kernel's time the SMs had work (sm__cycles_active.avg
over sm__cycles_elapsed.avg: a kernel of 20 blocks keeps 20 of the 132 SMs busy), DRAM throughput, grid and block.
Where that ncu rejects a metric name, the same from the SpeedOfLight, Occupancy and LaunchStats sections by their
display names. The step: the sums over launches of duration x metric / duration, so that ``sm_idle_share`` = 1 -
(the SMs' active share) is the part of the step's kernel time no SM had work, ``issue_idle_share`` = 1 - (SM
throughput) what the busy SMs did not use; both leave out the host time between kernels, which the step's own time
(tokens/s of the same server) against ``kernel_ms`` shows.
"""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
from typing import Any

METRICS = ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__cycles_active.avg", "sm__cycles_elapsed.avg",
           "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size", "launch__block_size")
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats")
# a launch's fields from either the metric names or the sections' display names
FIELDS = {"duration_ns": ("gpu__time_duration.sum", "Duration"),
          "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "Compute (SM) Throughput"),
          "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy"),
          "dram_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM Throughput", "Memory Throughput"),
          "sm_active_cycles": ("sm__cycles_active.avg", "SM Active Cycles"),
          "sm_elapsed_cycles": ("sm__cycles_elapsed.avg", "Elapsed Cycles", "SM Elapsed Cycles"),
          "grid": ("launch__grid_size", "Grid Size"), "block": ("launch__block_size", "Block Size")}
TO_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}


def command(tool: list[str], log: str, how: str, launch_count: int = 0) -> list[str]:
    """The ncu line: graph nodes one by one, caches and clocks as the program leaves them (a kernel pays no flush its
    predecessor would not have caused, and runs at the clock it would)."""
    what = ["--metrics", ",".join(METRICS)] if how == "metrics" else [x for s in SECTIONS for x in ("--section", s)]
    return ["ncu", "--graph-profiling", "node", "--cache-control", "none", "--clock-control", "none", *what,
            *(["--launch-count", str(launch_count)] if launch_count else []), "--csv", "--print-units", "base",
            "--log-file", log, *tool]


def launches(text: str) -> list[dict[str, Any]]:
    """ncu's ``--csv`` (a row per launch and metric) -> one dict per launch: kernel, and FIELDS found."""
    start = text.find('"ID"')
    if start < 0:
        return []
    by_id: dict[str, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        launch = by_id.setdefault(row["ID"], {"kernel": row.get("Kernel Name", ""), "grid_text": row.get("Grid Size", ""),
                                              "block_text": row.get("Block Size", "")})
        name, unit = row.get("Metric Name", ""), (row.get("Metric Unit") or "").lower()
        try:
            value = float((row.get("Metric Value") or "").replace(",", ""))
        except ValueError:
            continue
        for field, names in FIELDS.items():
            if name in names and field not in launch:
                launch[field] = value * TO_NS.get(unit, 1.0) if field == "duration_ns" else value
    return [x for x in by_id.values() if "duration_ns" in x]


def shape(launch: dict) -> str:
    """A kernel's base name with its grid and block: ``mul_mat_vec_q grid(512,1,1) block(32,4,1)``."""
    base = re.split(r"[<(]", launch["kernel"].replace("void ", ""), maxsplit=1)[0]
    return f"{base} grid{launch['grid_text']} block{launch['block_text']}"


def summarize(rows: list[dict[str, Any]], n_sm: int | None = None, top: int = 60) -> dict[str, Any]:
    """The pass's duration-weighted shares and its kernel shapes, slowest first (the rest summed as one line)."""
    total = sum(r["duration_ns"] for r in rows)

    def weighted(field: str, scale: float = 0.01) -> float | None:
        have = [r for r in rows if field in r]
        if not have or not total:
            return None
        return round(sum(r["duration_ns"] * r[field] * scale for r in have) / sum(r["duration_ns"] for r in have), 4)

    for r in rows:
        if r.get("sm_elapsed_cycles"):
            r["sm_active"] = 100.0 * r.get("sm_active_cycles", 0.0) / r["sm_elapsed_cycles"]
    active, busy = weighted("sm_active"), weighted("sm_pct")
    few = None
    if n_sm:
        grids = [r for r in rows if "grid" in r]
        few = round(sum(r["duration_ns"] for r in grids if r["grid"] < n_sm) / total, 4) if grids and total else None
    shapes: dict[str, dict[str, float]] = {}
    for r in rows:
        s = shapes.setdefault(shape(r), {"launches": 0, "us": 0.0, "_w": {}})
        s["launches"] += 1
        s["us"] += r["duration_ns"] / 1e3
        for f in ("sm_pct", "occupancy_pct", "sm_active", "dram_pct"):
            if f in r:
                s["_w"][f] = s["_w"].get(f, 0.0) + r["duration_ns"] * r[f]
    table = []
    for name, s in sorted(shapes.items(), key=lambda kv: -kv[1]["us"]):
        ns = s["us"] * 1e3
        table.append({"kernel": name, "launches": s["launches"], "us": round(s["us"], 1),
                      **{f: round(v / ns, 1) for f, v in s["_w"].items()}})
    rest = table[top:]
    table = table[:top] + ([{"kernel": f"(other {len(rest)} shapes)", "launches": sum(r["launches"] for r in rest),
                             "us": round(sum(r["us"] for r in rest), 1)}] if rest else [])
    return {"launches": len(rows), "kernel_ms": round(total / 1e6, 3),
            "sm_active_share": active, "sm_idle_share": None if active is None else round(1 - active, 4),
            "sm_throughput_share": busy, "issue_idle_share": None if busy is None else round(1 - busy, 4),
            "occupancy_share": weighted("occupancy_pct"), "dram_share": weighted("dram_pct"),
            "few_block_share": few, "n_sm": n_sm, "kernels": table}


def profile(tool: list[str], log: str, env: dict[str, str], launch_count: int = 0, n_sm: int | None = None,
            timeout: float = 900) -> dict[str, Any]:
    """ncu over one program run: the metrics by name, else the sections; summarize() of its launches, with the
    command that gave them (stdout beside the CSV as LOG.stdout)."""
    tried = []
    for how in ("metrics", "sections"):
        cmd = command(tool, f"{log}.{how}.csv", how, launch_count)
        with open(f"{log}.{how}.stdout", "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        texts = [open(f, errors="replace").read() for f in (f"{log}.{how}.csv", f"{log}.{how}.stdout") if os.path.exists(f)]
        rows = next((launches(t) for t in texts if launches(t)), [])
        if rows:
            return {"how": how, "command": " ".join(cmd), "rc": rc, **summarize(rows, n_sm)}
        tried.append(f"{how}: rc={rc}")
    raise RuntimeError(f"ncu gave no launches ({'; '.join(tried)}): see {log}.*.stdout")
