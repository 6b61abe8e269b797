"""Side-by-side benchmarks: ratios measured in one run, interleaved (this machine is shared and noisy).

    python -m lab.benchmarks.run [--preset tiny-deepseek4] [--rounds 3]   # -> lab/benchmarks/results/cpu.json
    python -m lab.benchmarks.report                                         # -> lab/notes/benchmarks.md

1. managed `pyllm serve` (Server) vs the same llama-server binary started by hand with the
   identical argv: prefill and decode ratio (target >= 0.98) and the time-to-ready overhead
   (target <= 1 s);
2. in-process `Llama.generate` vs llama-server on the same model, threads and device:
   decode ratio (target >= 0.95).
The GPU figures (lab/benchmarks/results/gpu.json) came from lab/benchmarks/gpu.py, which left the tree (cf107d3).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lab.bench.jsonrows import dumps
from pyllm_a100 import Llama, Server, build_info

from pyllm_a100.bench import throughput as bench
from pyllm_a100.process.net import free_port
from pyllm_a100.synth import synthesize


def raw_server(argv: list[str], port: int) -> tuple[subprocess.Popen, float]:
    """llama-server exactly as Server would start it, but spawned and polled by hand."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"raw llama-server exited {proc.returncode}")
        time.sleep(0.05)


def managed_vs_raw(model: Path, rounds: int, threads: int, prompt: int, gen: int) -> dict:
    rows = {"raw": [], "managed": []}
    for i in range(rounds):
        for kind in (("raw", "managed") if i % 2 == 0 else ("managed", "raw")):  # ABBA: order effects cancel
            port = free_port()
            if kind == "managed":
                started = time.perf_counter()
                with Server(model, port=port, ctx_size=2048, extra_args=["-t", str(threads)]) as srv:
                    ready = time.perf_counter() - started
                    result = bench.run(srv.base_url, prompt_tokens=prompt, gen_tokens=gen, repeat=3)
            else:
                argv = Server(model, port=port, ctx_size=2048, extra_args=["-t", str(threads)]).argv
                proc, ready = raw_server(argv, port)
                try:
                    result = bench.run(f"http://127.0.0.1:{port}", prompt_tokens=prompt, gen_tokens=gen, repeat=3)
                finally:
                    proc.terminate()
                    proc.wait()
            rows[kind].append((ready, result.prefill_tps, result.decode_tps))
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in rows.items()}
    return {
        "ready_raw_s": med["raw"][0], "ready_managed_s": med["managed"][0],
        "ready_overhead_s": med["managed"][0] - med["raw"][0],
        "prefill_ratio": med["managed"][1] / med["raw"][1], "decode_ratio": med["managed"][2] / med["raw"][2],
        "prefill_raw": med["raw"][1], "decode_raw": med["raw"][2],
    }


def in_process_vs_server(model: Path, rounds: int, threads: int, prompt_text: str, gen: int) -> dict:
    server_decode, local_decode = [], []
    for _ in range(rounds):
        with Server(model, port=0, ctx_size=2048, extra_args=["-t", str(threads), "-tb", str(threads)]) as srv:
            server_decode.append(bench.run(srv.base_url, prompt_tokens=64, gen_tokens=gen, repeat=3).decode_tps)
        llm = Llama(model, n_ctx=2048, n_threads=threads, n_threads_batch=threads)
        try:
            speeds = []
            for _ in range(3):
                list(llm.generate(prompt_text, max_tokens=gen, temperature=0))
                speeds.append(llm.last_generation.tokens_per_second)
            local_decode.append(statistics.median(speeds))
        finally:
            llm.close()
    s, l = statistics.median(server_decode), statistics.median(local_decode)
    return {"decode_server": s, "decode_in_process": l, "decode_ratio": l / s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny-deepseek4")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--models", type=Path, default=Path("/tmp/pyllm-bench-models"))
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "cpu.json",
                        help="where the figures go (lab/benchmarks/report.py renders lab/notes/benchmarks.md from them)")
    args = parser.parse_args()
    started = time.monotonic()
    model = synthesize(args.preset, args.models / f"{args.preset}.gguf", layers=args.layers, seed=42).first
    a = managed_vs_raw(model, args.rounds, args.threads, args.prompt, args.gen)
    print(f"managed vs raw: prefill {a['prefill_ratio']:.3f}, decode {a['decode_ratio']:.3f}, ready {a['ready_overhead_s']:+.2f} s", flush=True)
    b = in_process_vs_server(model, args.rounds, args.threads, "The quick brown fox jumps over the lazy dog. " * 6, args.gen)
    print(f"in-process vs server: decode {b['decode_ratio']:.3f} ({b['decode_in_process']:.1f} vs {b['decode_server']:.1f} tokens/s)", flush=True)
    layers = f" --layers {args.layers}" if args.layers else ""
    result = {
        "command": (f"python -m lab.benchmarks.run --preset {args.preset}{layers} --rounds {args.rounds} "
                    f"--prompt {args.prompt} --gen {args.gen} --threads {args.threads}"),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "settings": {k: v for k, v in vars(args).items() if k not in ("models", "json")},
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "build": {k: build_info().get(k) for k in ("llama_cpp_commit", "cuda", "cuda_version")},
        "managed_vs_raw": a, "in_process_vs_server": b, "seconds": round(time.monotonic() - started),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".tmp")
    tmp.write_text(dumps(result))
    tmp.replace(args.json)
    print(f"wrote {args.json}; python -m lab.benchmarks.report renders lab/notes/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
