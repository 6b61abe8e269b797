"""lab.runs.gpu_decode's bench switches (lab.bench.decode_switches) name variables that our patches read
(vendor/patches, or the measured ones in lab/patches)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PIN_OWN = {"GGML_CUDA_GRAPH_OPT"}  # read by the pin itself (ggml-cuda.cu), not by a patch of ours


def test_every_switch_names_a_variable_a_patch_reads() -> None:
    from lab.bench.decode_switches import ENV_COLUMNS, SWITCHES

    patches = "".join(p.read_text() for folder in (REPO / "vendor" / "patches", REPO / "lab" / "patches") for p in folder.glob("*.patch"))
    added = "\n".join(line for line in patches.splitlines() if line.startswith("+"))  # what our patches add
    unread = sorted(var for env in ENV_COLUMNS.values() for var in env if var not in PIN_OWN and f'"{var}"' not in added)
    assert not unread, f"switch variables no patch reads: {unread}"
    assert all(what for _, what in SWITCHES.values())
