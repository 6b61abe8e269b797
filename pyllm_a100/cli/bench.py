"""Measurements: bench, tune."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from .common import MODEL_HELP, JsonFlag, print_table


def bench_cmd(
    model: Annotated[Optional[str], typer.Argument(help="A model to serve for the benchmark (or use --url).")] = None,
    url: Annotated[Optional[str], typer.Option(help="Benchmark a running server instead, e.g. http://127.0.0.1:8080.")] = None,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length in tokens.")] = 512,
    gen_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 128,
    concurrency: Annotated[str, typer.Option(help="Requests in flight at once; a list (1,4,8,16,32) measures each level.")] = "1",
    parallel: Annotated[Optional[str], typer.Option(help="With MODEL: server slots to compare, one server each: default, N (context split between slots), Nu (one shared KV pool); e.g. default,16,16u.")] = None,
    repeat: Annotated[int, typer.Option(help="Requests per client (per level with a --concurrency list).")] = 3,
    verify_cost: Annotated[Optional[str], typer.Option("--verify-cost", help="With MODEL: time one forward of k tokens vs one decode step, k = FIRST-LAST (1-16), with llama-bench.")] = None,
    depth: Annotated[int, typer.Option(help="With --verify-cost: tokens already in the context.")] = 512,
    spec_args: Annotated[Optional[str], typer.Option("--spec-args", help="With MODEL: the draft's llama-server arguments ('-md D.gguf --spec-type draft-simple'); compares acceptance and step cost against no draft.")] = None,
    tensor_split: Annotated[Optional[str], typer.Option(help="With MODEL: 1x8, 3,1 ...")] = None,
    ctx_size: Annotated[Optional[int], typer.Option(help="With MODEL: context length (per slot with a --concurrency list).")] = None,
    api_key: Annotated[Optional[str], typer.Option(help="API key of the server at --url.", envvar="PYLLM_API_KEY")] = None,
    profile: Annotated[bool, typer.Option("--profile", help="With MODEL: the kernels of one decode step, timed per CUDA graph node by ncu (Nsight Compute); needs a CUDA build and ncu on PATH.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Prefill and decode tokens/s, time to first token and throughput under concurrency; verify cost; draft acceptance."""
    from ..bench import throughput as bench, concurrency as bench_concurrency, speculative as bench_spec
    from ..serve.server import Server

    if (model is None) == (url is None):
        raise bench.BenchError("give a MODEL to serve for the benchmark, or --url of a running server (not both)")
    modes = [name for name, given in (("--verify-cost", verify_cost), ("--spec-args", spec_args), ("--profile", profile or None))
             if given is not None]
    if len(modes) > 1:
        raise bench.BenchError(f"{' and '.join(modes)} are separate benchmarks: run one at a time")
    if modes and model is None:
        raise bench.BenchError(f"{modes[0]} starts the model itself: give a MODEL instead of --url")
    if profile:
        from ..bench.profile import profile_decode_step

        step = profile_decode_step(model)
        if as_json:
            print(json.dumps(step.as_row(), indent=2))
            return
        print_table(f"one decode step of {step.model}: {step.kernels} kernels, {step.us:.0f} us of kernel time (ncu, caches warm)",
                    ["kernel", "launches", "us", "share"],
                    [[r.family, str(r.count), f"{r.us:.1f}", f"{100 * r.us / max(step.us, 1e-9):.1f} %"] for r in step.rows])
        return
    if verify_cost is not None:
        ks = bench_spec.parse_k_range(verify_cost)
        cost = bench_spec.verify_cost(model, ks, depth=depth, tensor_split=tensor_split)
        if as_json:
            print(json.dumps(cost.as_row(), indent=2))
            return
        print_table(f"one forward of k tokens at depth {cost.depth} vs one decode step ({cost.decode_ms:.3f} ms)",
                    ["k", "ms per forward", "x decode step"], [[str(r["k"]), f"{r['ms']:.3f}", f"{r['ratio']:.2f}"] for r in cost.rows])
        return
    if spec_args is not None:
        import shlex

        run = bench_spec.draft_run(model, shlex.split(spec_args), prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                                   requests=repeat, tensor_split=tensor_split)
        if as_json:
            print(json.dumps(run.as_row(), indent=2))
            return
        print(f"draft: {' '.join(run.draft_args)}")
        print(f"acceptance {run.acceptance:.3f} ({run.accepted} of {run.drafted} drafted tokens), same tokens as without: {run.same_tokens}")
        print(f"step: {run.plain_step_ms:.3f} ms without the draft, {run.draft_step_ms:.3f} ms with it "
              f"(overhead {run.overhead_ms:+.3f} ms per step); decode {run.plain_decode_tps:.1f} -> {run.draft_decode_tps:.1f} tokens/s")
        return
    levels = bench_concurrency.parse_levels(concurrency)
    parallels = bench_concurrency.parse_parallel(parallel) if parallel is not None else None
    if parallels is not None and url is not None:
        raise bench.BenchError("--parallel sets the slots of a server this command starts: give a MODEL, or start the server with it")
    if len(levels) == 1 and parallels is None:  # the single-level report (the server gets one slot per client)
        if url is not None:
            result = bench.run(url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=levels[0], repeat=repeat, api_key=api_key)
        else:
            with Server(model, port=0, ctx_size=ctx_size or 4096, tensor_split=tensor_split, parallel=levels[0], ready_timeout=3600) as server:
                result = bench.run(server.base_url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=levels[0], repeat=repeat)
        if as_json:
            print(json.dumps(result.as_row(), indent=2))
            return
        print(f"{'prompt':>7} {'gen':>5} {'conc':>5} {'reqs':>5} {'prefill t/s':>12} {'decode t/s':>11} {'TTFT s':>8} {'throughput t/s':>15}")
        print(f"{result.prompt_tokens:>7} {result.gen_tokens:>5} {result.concurrency:>5} {result.requests:>5} "
              f"{result.prefill_tps:>12.1f} {result.decode_tps:>11.1f} {result.ttft_s:>8.3f} {result.throughput_tps:>15.1f}")
        return
    servers: dict[str, list[str]] = {}
    if url is not None:
        rows = bench_concurrency.measure(url, levels, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                                         requests_per_stream=repeat, api_key=api_key)
    else:
        rows = bench_concurrency.serve_and_measure(
            model, levels, parallels or [bench_concurrency.Slots()], prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, requests_per_stream=repeat,
            ctx_per_slot=ctx_size, tensor_split=tensor_split, on_server=servers.__setitem__)
    ratios = bench_concurrency.scaling(rows)
    failures = sum(r.failures for r in rows)
    if as_json:
        print(json.dumps({"prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "requests_per_stream": repeat,
                          "servers": servers, "levels": [dict(r.as_row(), scaling=ratios[(r.slots, r.concurrency)]) for r in rows],
                          "failures": failures}, indent=2))
    else:
        print_table(f"prompt {prompt_tokens} tokens, {gen_tokens} generated, {repeat} request(s) per stream",
                    ["--parallel", "streams", "aggregate t/s", "x 1 stream", "per-stream t/s", "TTFT p50 s", "TTFT p99 s", "requests", "failures"],
                    [[r.slots, str(r.concurrency), f"{r.aggregate_tps:.1f}", f"{ratios[(r.slots, r.concurrency)]:.2f}", f"{r.per_stream_tps:.1f}", f"{r.ttft_p50_s:.3f}",
                      f"{r.ttft_p99_s:.3f}", str(r.requests), str(r.failures)] for r in rows])
    if failures:
        first = next(r.first_error for r in rows if r.first_error)
        raise bench.BenchError(f"{failures} request(s) failed (first: {first}): see the server's log (pyllm logs) or lower --concurrency")


def tune_cmd(
    model: Annotated[str, typer.Argument(help=MODEL_HELP)],
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length per request.")] = 512,
    gen_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 64,
    repeat: Annotated[int, typer.Option(help="Requests per candidate.")] = 2,
    ctx_size: Annotated[int, typer.Option(help="Context length for every candidate.")] = 4096,
) -> None:
    """Try split modes, batch sizes, flash attention and GPU counts; print the fastest as a serve command."""
    from ..bench import throughput as bench

    print(f"{'candidate':<34} {'prefill t/s':>12} {'decode t/s':>11} {'TTFT s':>8}")

    def show(row) -> None:
        if row.result is None:
            print(f"{row.candidate.label:<34} failed: {row.error}")
        else:
            r = row.result
            print(f"{row.candidate.label:<34} {r.prefill_tps:>12.1f} {r.decode_tps:>11.1f} {r.ttft_s:>8.3f}")
        sys.stdout.flush()

    rows = bench.tune(model, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, repeat=repeat, ctx_size=ctx_size, on_row=show)
    best = bench.winner(rows)
    base = rows[0].result
    gain = f" ({best.result.decode_tps / base.decode_tps:.2f}x decode vs llama.cpp's defaults)" if base and base.decode_tps else ""
    if best is rows[0]:  # the defaults, kept
        print(f"fastest: llama.cpp's defaults (nothing beat them by more than {bench.MIN_GAIN:.0%}, this run's noise level)")
    else:
        print(f"fastest: {best.candidate.label}{gain}")
    print(f"  {bench.serve_command(model, best.candidate)}")
