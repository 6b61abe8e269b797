"""llama-batched-bench side by side: N sequences decoding together, one ubatch of N tokens a step (sequence ids
0..N-1), so the batched kernels of two builds compare without a server's scheduling (python -m lab.runs.gpu_decode batched)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

# 256-token prompts, 64 decode steps; -c 16384 leaves 512 tokens to each of up to 32 sequences
ARGS = ["-npp", "256", "-ntg", "64", "-c", "16384", "-b", "2048", "-ub", "512", "-ngl", "99", "-fa", "on",
        "--output-format", "jsonl"]


def run(exe: str | os.PathLike[str], model: str | os.PathLike[str], npl: str, *, env: dict[str, str] | None = None,
        timeout: float = 900, args: list[str] | None = None, log: list[str] | None = None) -> list[dict[str, Any]]:
    """One llama-batched-bench run: its JSON line per sequence count (pl, speed_tg, speed_pp, ...). ``args`` replace
    ARGS; ``log`` (a list) gets the program's stderr (its device lines: lab/bench/dispatch.py reads the capability)."""
    p = subprocess.run([str(exe), "-m", str(model), "-npl", npl, *(ARGS if args is None else args)], capture_output=True,
                       text=True, timeout=timeout, env=env)
    if log is not None:
        log.append(p.stderr)
    if p.returncode:
        raise RuntimeError(f"llama-batched-bench rc={p.returncode}: {p.stderr[-800:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def side_by_side(columns: Sequence[str], run_column: Callable[[str], list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Every column in order, then reversed (a drift of the machine shows between one column's two runs): per
    column and sequence count each round's decode and prefill tokens/s, their means (tg_tps) and tg_vs_pin."""
    rows: dict[str, dict[str, Any]] = {}
    for rnd, col in enumerate([*columns, *columns[::-1]]):
        mine = rows.setdefault(col, {})
        try:
            for r in run_column(col):
                mine.setdefault(str(r["pl"]), []).append({"round": rnd, "speed_tg": r["speed_tg"], "speed_pp": r["speed_pp"]})
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            mine.setdefault("errors", []).append(str(e)[-800:])
    for col in rows.values():
        col["tg_tps"] = {pl: round(sum(x["speed_tg"] for x in v) / len(v), 2) for pl, v in col.items() if pl.isdigit()}
    for name, col in rows.items():  # against the pin of the same dispatch (pin, or pin@a100 for a column@a100)
        at = name.rpartition("@")[2] if "@" in name else ""
        base = rows.get("pin" + (f"@{at}" if at else ""), {}).get("tg_tps", {})
        col["tg_vs_pin"] = {pl: round(v / base[pl], 3) for pl, v in col["tg_tps"].items() if base.get(pl)}
    return rows
