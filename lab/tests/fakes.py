"""Stand-ins for llama.cpp's programs, for the lab's GPU scripts on a machine without a GPU (or without llama.cpp).

Each is a small Python script that answers like the real program, prints ggml-cuda's device line on stderr with
compute capability 8.0 when the a100-dispatch shim is in LD_PRELOAD (9.0 otherwise), and is a little faster when it
runs from a folder whose name says "patched" (and slower with GGML_CUDA_DISABLE_GRAPHS set): enough for the scripts' plumbing (columns, dispatch, parsing, JSON)
to be tested end to end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

COMMON = r'''
import json, os, sys
args = sys.argv[1:]
a100 = "a100-dispatch" in os.environ.get("LD_PRELOAD", "")
here = os.path.dirname(os.path.abspath(sys.argv[0]))
speed = (0.6 if "patched" in here else 1.0) * (1.02 if a100 else 1.0) * (1.5 if os.environ.get("GGML_CUDA_DISABLE_GRAPHS") else 1.0)
sys.stderr.write("ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143167 MiB):\n")
sys.stderr.write(f"  Device 0: NVIDIA H200, compute capability {'8.0' if a100 else '9.0'}, VMM: yes, VRAM: 143167 MiB\n")
if "--list-devices" in args:
    print("Available devices:\n  CUDA0: NVIDIA H200 (143167 MiB, 142000 MiB free)")
    sys.exit(0)
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
'''

LLAMA_BENCH = COMMON + r'''
ps = [int(x) for x in opt("-p", "512").split(",") if x]
n, d, r = int(opt("-n", "128")), int(opt("-d", "0")), int(opt("-r", "5"))
out = []
for p in ps:
    if p:
        ns = [int((10.0 + 1.5 * (p - 1)) * speed * 1e6 * (1 + 0.01 * i)) for i in range(r)]
        out.append({"n_prompt": p, "n_gen": 0, "n_depth": d, "samples_ns": ns, "avg_ts": p / (sum(ns) / len(ns) / 1e9),
                    "stddev_ts": 0.1, "samples_ts": [p / (x / 1e9) for x in ns]})
if n:
    ns = [int(10.0 * n * speed * 1e6 * (1 + 0.01 * i)) for i in range(r)]
    out.append({"n_prompt": 0, "n_gen": n, "n_depth": d, "samples_ns": ns, "avg_ts": n / (sum(ns) / len(ns) / 1e9),
                "stddev_ts": 0.1, "samples_ts": [n / (x / 1e9) for x in ns]})
print(json.dumps(out, indent=1))
'''

BATCHED_BENCH = COMMON + r'''
for pl in [int(x) for x in opt("-npl", "1").split(",")]:
    print(json.dumps({"n_kv_max": 4096, "pl": pl, "pp": int(opt("-npp", "128")), "tg": int(opt("-ntg", "128")),
                      "speed_pp": 3000.0 / speed, "speed_tg": 100.0 * pl ** 0.7 / speed}))
'''


def write(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return path


def builds(work: Path, labels: tuple[str, ...] = ("pin", "patched")) -> None:
    """WORK/LABEL-bin with llama-bench and llama-batched-bench stand-ins, and the model files the scripts expect."""
    for label in labels:
        write(work / f"{label}-bin", "llama-bench", LLAMA_BENCH)
        write(work / f"{label}-bin", "llama-batched-bench", BATCHED_BENCH)
    for name in ("v4-4l", "v4-43l"):
        (work / f"{name}.gguf").write_bytes(b"GGUF")


def dummy_shim(folder: Path) -> Path:
    """A loadable, empty shared object named like the shim (what --dispatch-shim gets in these tests): the
    stand-ins only look for its name in LD_PRELOAD."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "a100-dispatch.so"
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc:
        src = folder / "empty.c"
        src.write_text("int a100_dispatch_test_stub;\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(src)], check=True)
    else:  # the loader warns that it cannot preload it, and carries on
        shim.write_bytes(b"")
    return shim


def env_without_preload() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def program(module: str, *args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """A lab program run as its users run it, ``python -m MODULE ARGS`` from the repository root (text mode; the
    environment defaults to this one without a preloaded shim)."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or env_without_preload(), cwd=Path(__file__).resolve().parents[2])
