"""Issue 40's benchmark: an agent team's load on pyllm serve's defaults against the pin's own llama-server.

    python -m lab.benchmarks.agents MODEL --pin-server PATH/llama-server [--concurrency 8,16,32,64] [--repeat 1]
        [--system-tokens 2048] [--tail-tokens 256] [--gen-tokens 64]

Runs ``pyllm bench agents MODEL --baseline-binary PIN --json`` (pyllm serve's defaults, then the pin's
llama-server with ``--parallel 16 --kv-unified --ctx-size 16384``, one after the other in one run) and writes
lab/results/cpu-agents.json with the command, the date and the machine; then render docs/performance.md
with ``python -m lab.benchmarks.report``.

The pin's llama-server, CPU only (about 10 minutes on 2 cores), from the sdist the build already downloaded:

    tar xzf vendor/downloads/llama_cpp_python-*.tar.gz -C /tmp/pin
    cmake -S /tmp/pin/llama_cpp_python-*/vendor/llama.cpp -B /tmp/pin/build -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build /tmp/pin/build --target llama-server -j
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from lab.bench.jsonrows import dumps

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--pin-server", required=True, type=Path, help="the pin's llama-server (see above)")
    parser.add_argument("--concurrency", default="8,16,32,64")
    parser.add_argument("--repeat", default="1")
    parser.add_argument("--system-tokens", default="2048")
    parser.add_argument("--tail-tokens", default="256")
    parser.add_argument("--gen-tokens", default="64")
    parser.add_argument("--from", dest="source", type=Path, help="wrap what an earlier run of the same command printed instead of running it")
    parser.add_argument("--out", type=Path, default=REPO / "lab" / "results" / "cpu-agents.json")
    args = parser.parse_args()
    if not os.access(args.pin_server, os.X_OK):
        print(f"error: --pin-server {args.pin_server} is not an executable llama-server: build the pin's (see --help)", file=sys.stderr)
        return 1
    argv = ["pyllm", "bench", "agents", args.model, "--concurrency", args.concurrency, "--repeat", args.repeat,
            "--system-tokens", args.system_tokens, "--tail-tokens", args.tail_tokens, "--gen-tokens", args.gen_tokens,
            "--baseline-binary", str(args.pin_server), "--json"]
    if args.source:
        result = json.loads(args.source.read_text())
    else:
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            return done.returncode
        result = json.loads(done.stdout)
    cores = os.cpu_count()
    result.update(model=Path(args.model).name, date=datetime.date.today().isoformat(),
                  machine=f"{cores} CPU cores ({platform.machine()}), no GPU",
                  command=shlex.join(Path(a).name if a == args.model else "PIN/llama-server" if a == str(args.pin_server) else a
                                     for a in argv))
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(dumps(result))
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
