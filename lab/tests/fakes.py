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


# test-backend-ops: MUL_MAT (one case not supported), ADD (one case fails), FLASH_ATTN_EXT in three head-size parts (the
# hsk=576 part hangs, for the per-part timeout), and a fused test name (MY_FUSION)
BACKEND_OPS = COMMON + r'''
import re, time
CASES = [("MUL_MAT", "type_a=f16,n=1", True), ("MUL_MAT", "type_a=q4_0,n=8", True), ("MUL_MAT", "type_a=iq1_m,n=1", False),
         ("ADD", "type=f32,ne=[1,1,1,1]", True), ("ADD", "type=f16,ne=[10,5,4,3]", True),
         ("FLASH_ATTN_EXT", "hsk=64,hsv=64,nh=4,kv=512", True), ("FLASH_ATTN_EXT", "hsk=64,hsv=64,nh=4,kv=113", True),
         ("FLASH_ATTN_EXT", "hsk=576,hsv=512,nh=1,kv=1024", True), ("FLASH_ATTN_EXT", "hsk=65,hsv=67,nh=4,kv=113", True),
         ("MY_FUSION", "n=3", True)]
mode = args[0] if args and args[0] in ("test", "support", "perf") else "test"
f, p = opt("-o"), opt("-p")
def chosen(op, params):
    if f and f != op and (re.fullmatch(r"[A-Z0-9_]+", f) or not re.search(f, op)):
        return False
    return not p or re.search(p, params)
G, R, Z = "\x1b[1;32m", "\x1b[1;31m", "\x1b[0m"
print("Testing 2 devices\n")
ok = run = 0
failing = []
for op, params, supported in CASES:
    if not chosen(op, params):
        continue
    if mode == "support":
        if op != "MY_FUSION":  # support mode leaves out the fusion cases (run_whole_graph), as the real one does
            print(f"  {op}({params}): " + (f"{G}SUPPORTED{Z}" if supported else f"{R}NOT SUPPORTED{Z}"))
        continue
    if not supported:
        print(f"  {op}({params}): not supported [CUDA0] ")
        continue
    if "hsk=576" in params:
        sys.stdout.flush()
        time.sleep(60)
    run += 1
    if op == "ADD" and "f16" in params:
        print(f"  {op}({params}): [ADD] NMSE = 0.100000000 > 0.000000100 {R}FAIL{Z}")
        failing.append(f"{op}({params})")
    else:
        ok += 1
        print(f"  {op}({params}): {G}OK{Z}")
    sys.stdout.flush()
if mode == "test":
    print(f"  {ok}/{run} tests passed")
    if failing:
        print("\nFailing tests:")
        print("\n".join("  " + x for x in failing))
    print(f"  Backend CUDA0: {G + 'OK' if ok == run else R + 'FAIL'}{Z}")
sys.exit(0 if ok == run else 1)
'''

# llama-server: /health, and /completion with greedy tokens that depend on the build and the dispatch: patched's top
# log-probabilities differ from the pin's in the last bits; under the shim, the long prompt's tokens part from native at 40
SERVER = COMMON + r'''
import http.server
port = int(opt("--port"))
patched = "patched" in here
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req.get("n_predict", 8)
        toks = [(len(req["prompt"]) * 13 + i * 7) % 1000 for i in range(n)]
        if a100 and n > 40 and len(req["prompt"]) > 100:  # the long prompt: other kernels under the A100 dispatch
            toks[40] += 1
        lp = [[{"logprob": -0.5 * (i % 3) - (1e-7 if patched else 0.0)}] for i in range(n)]
        self.reply({"tokens": toks, "completion_probabilities": [{"top_logprobs": x} for x in lp],
                    "timings": {"predicted_per_second": 100.0 * speed}})
sys.stderr.write("main: server is listening on http://127.0.0.1:%d\n" % port)
sys.stderr.flush()
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''

COMPLETION = COMMON + r'''
print("The capital of France is Paris, and its river is the Seine.")
'''

SANITIZER = r'''
import subprocess, sys
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
i = 0
while i < len(args) and args[i].startswith("--"):
    i += 2
p = subprocess.run(args[i:])
if tool == "racecheck":
    print("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)")
else:
    print("========= ERROR SUMMARY: 0 errors")
sys.exit(p.returncode)
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
        write(work / f"{label}-bin", "test-backend-ops", BACKEND_OPS)
        write(work / f"{label}-bin", "llama-completion", COMPLETION)
        write(work / f"{label}-bin", "llama-server", SERVER)
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


def sanitizer(folder: Path) -> Path:
    """A compute-sanitizer stand-in (put its folder first on PATH): runs the program, prints the tool's summary."""
    return write(folder, "compute-sanitizer", SANITIZER)


def program(module: str, *args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """A lab program run as its users run it, ``python -m MODULE ARGS`` from the repository root (text mode; the
    environment defaults to this one without a preloaded shim)."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or env_without_preload(), cwd=Path(__file__).resolve().parents[2])
