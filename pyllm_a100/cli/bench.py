"""Measurements: `pyllm bench run|concurrency|agents|cotenancy|verify|draft|speculate|profile|tune`, and `pyllm tune`.

Each subcommand is a thin layer over one library function in pyllm_a100.bench. The single-command spelling of
earlier releases (`pyllm bench MODEL --concurrency 1,4 / --verify-cost 1-16 / --spec-args ... / --profile`) still
works: :func:`legacy_argv` rewrites it into the subcommand before typer parses it.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from typing import Annotated, Optional

import typer

from .common import MODEL_HELP, POOL_HELP, CtxPerSlot, JsonFlag, OldCtxPerSlot, per_slot_context, print_table

bench_app = typer.Typer(
    help="Measure a model or a running server: tokens/s, time to first token, concurrency, verify cost, drafts, kernels.",
    no_args_is_help=True,
)

# One definition of each option the subcommands share.
Model = Annotated[Optional[str], typer.Argument(help="A model to serve for the benchmark (or use --url).")]
ModelArg = Annotated[str, typer.Argument(help=MODEL_HELP)]
Url = Annotated[Optional[str], typer.Option(help="Benchmark a running server instead, e.g. http://127.0.0.1:8080.")]
PromptTokens = Annotated[int, typer.Option(help="Prompt length in tokens.")]
GenTokens = Annotated[int, typer.Option(help="Tokens generated per request.")]
Repeat = Annotated[int, typer.Option(help="Requests per client (per level with a --concurrency list).")]
TensorSplit = Annotated[Optional[str], typer.Option(help="With MODEL: 1x8, 3,1 ...")]
ApiKey = Annotated[Optional[str], typer.Option(help="API key of the server at --url.", envvar="PYLLM_API_KEY")]

SUBCOMMANDS = ("run", "concurrency", "agents", "cotenancy", "verify", "draft", "speculate", "profile", "tune")


def _model_or_url(model: Optional[str], url: Optional[str]) -> None:
    from ..bench.client import BenchError

    if (model is None) == (url is None):
        raise BenchError("give a MODEL to serve for the benchmark, or --url of a running server (not both)")


@bench_app.command("run")
def run_cmd(
    model: Model = None,
    url: Url = None,
    prompt_tokens: PromptTokens = 512,
    gen_tokens: GenTokens = 128,
    concurrency: Annotated[str, typer.Option(help="Requests in flight at once (the server gets one slot per client).")] = "1",
    repeat: Repeat = 3,
    tensor_split: TensorSplit = None,
    ctx_size: Annotated[Optional[int], typer.Option(help=f"With MODEL: the {POOL_HELP} (default 4096).")] = None,
    api_key: ApiKey = None,
    as_json: JsonFlag = False,
) -> None:
    """Prefill and decode tokens/s and time to first token, at one concurrency level."""
    from ..bench import run as bench_run
    from ..bench.concurrency import parse_levels

    _model_or_url(model, url)
    levels = parse_levels(concurrency)
    if len(levels) > 1:
        raise bench_run.BenchError(f"--concurrency {concurrency}: run measures one level; several: pyllm bench concurrency")
    concurrency = levels[0]
    if url is not None:
        result = bench_run.run(url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=concurrency,
                                repeat=repeat, api_key=api_key)
    else:
        result = bench_run.serve_and_run(model, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=concurrency,
                                          repeat=repeat, ctx_size=ctx_size, tensor_split=tensor_split)
    if as_json:
        print(json.dumps(result.as_row(), indent=2))
        return
    print(f"{'prompt':>7} {'gen':>5} {'conc':>5} {'reqs':>5} {'prefill t/s':>12} {'decode t/s':>11} {'TTFT s':>8} {'throughput t/s':>15}")
    print(f"{result.prompt_tokens:>7} {result.gen_tokens:>5} {result.concurrency:>5} {result.requests:>5} "
          f"{result.prefill_tps:>12.1f} {result.decode_tps:>11.1f} {result.ttft_s:>8.3f} {result.throughput_tps:>15.1f}")


@bench_app.command("concurrency")
def concurrency_cmd(
    model: Model = None,
    url: Url = None,
    concurrency: Annotated[str, typer.Option(help="Levels of requests in flight, e.g. 1,4,8,16,32.")] = "1,4,8,16",
    parallel: Annotated[Optional[str], typer.Option(help="With MODEL: server slots to compare, one server each: default, N (context split between slots), Nu (one shared KV pool); e.g. default,16,16u.")] = None,
    prompt_tokens: PromptTokens = 512,
    gen_tokens: GenTokens = 128,
    repeat: Repeat = 3,
    tensor_split: TensorSplit = None,
    ctx_per_slot: CtxPerSlot = None,
    ctx_size: OldCtxPerSlot = None,
    api_key: ApiKey = None,
    as_json: JsonFlag = False,
) -> None:
    """Aggregate and per-stream tokens/s, TTFT p50/p99 and failures at each concurrency level, side by side."""
    from ..bench import concurrency as bench_concurrency
    from ..bench.client import BenchError

    _model_or_url(model, url)
    levels = bench_concurrency.parse_levels(concurrency)
    parallels = bench_concurrency.parse_parallel(parallel) if parallel is not None else None
    if parallels is not None and url is not None:
        raise BenchError("--parallel sets the slots of a server this command starts: give a MODEL, or start the server with it")
    servers: dict[str, list[str]] = {}
    if url is not None:
        rows = bench_concurrency.measure(url, levels, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                                         requests_per_stream=repeat, api_key=api_key)
    else:
        rows = bench_concurrency.serve_and_measure(
            model, levels, parallels or [bench_concurrency.Slots()], prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
            requests_per_stream=repeat, ctx_per_slot=per_slot_context(ctx_per_slot, ctx_size, "bench concurrency"),
            tensor_split=tensor_split, on_server=servers.__setitem__)
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
        raise BenchError(f"{failures} request(s) failed (first: {first}): see the server's log (pyllm logs) or lower --concurrency")


@bench_app.command("agents")
def agents_cmd(
    model: Model = None,
    url: Url = None,
    concurrency: Annotated[str, typer.Option(help="Clients at once, per level.")] = "8,16,32,64",
    system_tokens: Annotated[int, typer.Option(help="The system prompt every request shares, in tokens.")] = 2048,
    tail_tokens: Annotated[int, typer.Option(help="Each request's own tokens after it.")] = 256,
    gen_tokens: GenTokens = 64,
    repeat: Annotated[int, typer.Option(help="Requests per client, one after the other.")] = 2,
    baseline_args: Annotated[Optional[str], typer.Option(help="With MODEL: the baseline server's llama-server flags (default: llama.cpp's team setting, 16 slots sharing a 16,384-token pool).")] = None,
    baseline_binary: Annotated[Optional[str], typer.Option(help="With MODEL: the baseline's llama-server (e.g. a build of the pin); default: this package's.")] = None,
    tensor_split: TensorSplit = None,
    api_key: ApiKey = None,
    as_json: JsonFlag = False,
) -> None:
    """An agent team's load (a long shared system prompt, own tails, many clients): TTFT p50/p99, tokens/s,
    prompt-cache reuse and failures; with MODEL, pyllm serve's defaults against a baseline server in one run."""
    from ..bench import agents
    from ..bench.concurrency import parse_levels

    _model_or_url(model, url)
    load = agents.Load(system_tokens=system_tokens, tail_tokens=tail_tokens, gen_tokens=gen_tokens, requests_per_client=repeat)
    levels = parse_levels(concurrency)
    if url is not None:
        rows = agents.measure(url, levels, load, server=url, api_key=api_key)
    else:
        rows = agents.compare(model, levels, load, baseline_args=agents.BASELINE_ARGS if baseline_args is None else shlex.split(baseline_args), baseline_binary=baseline_binary,
                              tensor_split=tensor_split)
    if as_json:
        print(json.dumps({"load": dataclasses.asdict(load), "levels": [r.as_row() for r in rows]}, indent=2))
        return
    print_table(f"shared system prompt {system_tokens} tokens + {tail_tokens} of its own, {gen_tokens} generated, "
                f"{repeat} request(s) per client",
                ["server", "clients", "aggregate t/s", "TTFT p50 s", "TTFT p99 s", "prompt reused", "requests", "failures"],
                [[r.server, str(r.clients), f"{r.aggregate_tps:.1f}", f"{r.ttft_p50_s:.3f}", f"{r.ttft_p99_s:.3f}",
                  f"{r.prompt_reused:.0%}", str(r.requests), str(r.failures)] for r in rows])
    for r in rows:
        if r.first_error:
            print(f"{r.server}, {r.clients} clients: first failure: {r.first_error}")
    for line in agents.ratios(rows):
        print(line)


@bench_app.command("cotenancy")
def cotenancy_cmd(
    model: Model = None,
    url: Url = None,
    prompts: Annotated[int, typer.Option(help="Long prompts sent at once beside the decoding stream.")] = 1,
    prompt_tokens: Annotated[int, typer.Option(help="Each long prompt's length in tokens.")] = 65536,
    short_tokens: Annotated[int, typer.Option(help="A short request sent during the prefill, its TTFT timed (0: none).")] = 200,
    streams: Annotated[int, typer.Option(help="Streams decoding beside the long prompts; the first is timed, the others' "
                                              "failures counted (agent traffic: --streams 16 --prompts 4).")] = 1,
    server_args: Annotated[Optional[str], typer.Option(help="With MODEL: llama-server flags for pyllm serve's run (as after --), "
                                                       "e.g. '--decode-latency-target 50'.")] = None,
    baseline_args: Annotated[Optional[str], typer.Option(help="With MODEL: more llama-server flags for the baseline, which runs "
                                                         "llama.cpp's own scheduling (-b 2048, no decode latency target).")] = None,
    baseline_binary: Annotated[Optional[str], typer.Option(help="With MODEL: the baseline's llama-server (e.g. a build of the pin, "
                                                           "with --baseline-args '' ); default: this package's.")] = None,
    tensor_split: TensorSplit = None,
    api_key: ApiKey = None,
    as_json: JsonFlag = False,
) -> None:
    """One stream's tokens/s alone and while long prompts are prefilled beside it (gaps p50/p99/max), the prefill's time
    and a short request's TTFT; with MODEL, pyllm serve's defaults against a baseline server in one run."""
    from ..bench import cotenancy

    _model_or_url(model, url)
    load = cotenancy.Load(prompts=prompts, prompt_tokens=prompt_tokens, short_tokens=short_tokens, streams=streams)
    if url is not None:
        rows = [cotenancy.measure(url, load, server=url, api_key=api_key)]
    else:
        rows = cotenancy.compare(model, load, server_args=shlex.split(server_args or ""), tensor_split=tensor_split,
                                 baseline_args=cotenancy.BASELINE_ARGS if baseline_args is None else shlex.split(baseline_args),
                                 baseline_binary=baseline_binary)
    if as_json:
        print(json.dumps({"load": dataclasses.asdict(load), "rows": [r.as_row() for r in rows],
                          "same_stream_tokens": cotenancy.same_tokens(rows)}, indent=2))
        return
    beside = f"a stream decoding (of {streams})" if streams > 1 else "a stream decoding"
    print_table(f"{beside} beside {prompts} prompt(s) of {prompt_tokens} tokens",
                ["server", "solo t/s", "during t/s", "kept", "gap p50 ms", "gap p99 ms", "gap max ms", "prefill s",
                 "short TTFT s"] + (["failed streams"] if streams > 1 else []),
                [[r.server, f"{r.solo_tps:.1f}", f"{r.during_tps:.1f}", f"{r.kept:.0%}", f"{r.gap_p50_ms:.0f}",
                  f"{r.gap_p99_ms:.0f}", f"{r.gap_max_ms:.0f}", f"{r.prefill_s:.2f}",
                  "-" if r.short_ttft_s is None else f"{r.short_ttft_s:.2f}"] + ([str(r.failures)] if streams > 1 else [])
                 for r in rows])
    for line in cotenancy.ratios(rows):
        print(line)


@bench_app.command("verify")
def verify_cmd(
    model: ModelArg,
    k: Annotated[str, typer.Option("--verify-cost", "--k", help="Tokens per forward to time: FIRST-LAST (1-16) or a list (1,2,4,8).")] = "1-16",
    depth: Annotated[int, typer.Option(help="Tokens already in the context.")] = 512,
    tensor_split: TensorSplit = None,
    as_json: JsonFlag = False,
) -> None:
    """One forward of k tokens (a speculative verify step) against one decode step, with llama-bench."""
    from ..bench import verify

    cost = verify.verify_cost(model, verify.parse_k_range(k), depth=depth, tensor_split=tensor_split)
    if as_json:
        print(json.dumps(cost.as_row(), indent=2))
        return
    print_table(f"one forward of k tokens at depth {cost.depth} vs one decode step ({cost.decode_ms:.3f} ms)",
                ["k", "ms per forward", "x decode step", "x weights read"],
                [[str(r["k"]), f"{r['ms']:.3f}", f"{r['ratio']:.2f}", f"{r['weights']:.2f}"] for r in cost.rows])


@bench_app.command("draft")
def draft_cmd(
    model: ModelArg,
    spec_args: Annotated[str, typer.Option("--spec-args", help="The draft's llama-server arguments, e.g. '-md D.gguf --spec-type draft-simple'.")],
    prompt_tokens: PromptTokens = 512,
    gen_tokens: GenTokens = 128,
    repeat: Repeat = 3,
    tensor_split: TensorSplit = None,
    as_json: JsonFlag = False,
) -> None:
    """Draft acceptance and step cost against no draft, with the same greedy tokens checked."""
    from ..bench import draft

    run = draft.draft_run(model, shlex.split(spec_args), prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                                requests=repeat, tensor_split=tensor_split)
    if as_json:
        print(json.dumps(run.as_row(), indent=2))
        return
    print(f"draft: {' '.join(run.draft_args)}")
    print(f"acceptance {run.acceptance:.3f} ({run.accepted} of {run.drafted} drafted tokens), same tokens as without: {run.same_tokens}")
    print(f"step: {run.plain_step_ms:.3f} ms without the draft, {run.draft_step_ms:.3f} ms with it "
          f"(overhead {run.overhead_ms:+.3f} ms per step); decode {run.plain_decode_tps:.1f} -> {run.draft_decode_tps:.1f} tokens/s")


def _serve_help(name: str) -> str:
    """The help of a `pyllm serve` option that a bench command takes with the same meaning (one definition)."""
    from ..serve.options import ServeOptions

    return next(f.metadata["help"] for f in dataclasses.fields(ServeOptions) if f.name == name)


def _floats(text: str, option: str) -> list[float]:
    from ..bench.client import BenchError

    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchError(f"{option} {text!r}: give numbers separated by commas, e.g. 2.5,2.9") from None


@bench_app.command("speculate")
def speculate_cmd(
    model: ModelArg,
    draft: Annotated[str, typer.Option(help=_serve_help("draft"))],
    draft_max: Annotated[int, typer.Option(help="Longest draft to consider (verify forwards of up to this + 1 tokens are timed; the draft is served at "
                                               "this and at about half of it, to price a drafted token).")] = 7,
    accept_len: Annotated[str, typer.Option(help="Mean tokens a step yields with 7 drafted, comma-separated "
                                                 "(DSpark on real text: 2.5-2.9, the default; '' for none).")] = "2.5,2.9",
    acceptance: Annotated[str, typer.Option(help="Per-token acceptance rates to project too, e.g. 0.6,0.7.")] = "",
    depth: Annotated[int, typer.Option(help="Tokens already in the context of the verify forwards.")] = 512,
    prompt_tokens: PromptTokens = 128,
    gen_tokens: GenTokens = 128,
    repeat: Repeat = 3,
    tensor_split: TensorSplit = None,
    measure: Annotated[bool, typer.Option(help="Then serve each acceptance's best draft length with that acceptance made "
                                               "synthetic (llama-server --spec-synth-len) beside a plain run, and print "
                                               "the tokens/s measured next to the projection (one more plain server "
                                               "start and one per acceptance).")] = True,
    as_json: JsonFlag = False,
) -> None:
    """What a draft will give here: its cost, the verify cost per k, the best draft length and tokens/s per acceptance."""
    from ..bench import speculate as bench_speculate

    spec = bench_speculate.speculate(model, draft, draft_max=draft_max, accept_lens=_floats(accept_len, "--accept-len"),
                               rates=_floats(acceptance, "--acceptance"), depth=depth, prompt_tokens=prompt_tokens,
                               gen_tokens=gen_tokens, requests=repeat, tensor_split=tensor_split, measure=measure)
    if as_json:
        print(json.dumps(spec.as_row(), indent=2))
        return
    cost, run = spec.verify, spec.run
    print(f"verify: one forward of k tokens at depth {cost.depth} against one decode step ({cost.decode_ms:.3f} ms), "
          "and (in brackets) the weights it must read against one token's: "
          + ", ".join(f"k={r['k']} {r['ratio']:.2f}x ({r['weights']:.2f}x)" for r in cost.rows if r["k"] > 1))
    d = spec.draft
    at = " and ".join(f"{m['own_ms']:.3f} ms at {m['drafted']:.1f}" for m in d.measured)
    same = all(r.same_tokens for r in spec.runs)
    print(f"draft ({spec.spec_type}, {' '.join(spec.draft_args)}): its own cost {d.fixed_ms:.3f} ms a step + "
          f"{d.per_token_ms:.3f} ms per drafted token (measured: {at} drafted a step); "
          f"{spec.drafted_per_step:.1f} drafted per step, {run.accepted} of {run.drafted} accepted on this run's prompts; "
          f"same tokens as without: {'yes' if same else 'NO (see docs/speculative.md)'}")
    if not spec.choices:
        print(f"plain decoding: {spec.plain_tps:.1f} tokens/s; the draft proposed nothing on this run's prompts: give "
              "--accept-len or --acceptance to project what it would give")
        return
    def measured(c: bench_speculate.Choice) -> list[str]:
        m = c.measured
        if m and "error" in m:
            return ["not run", "-"]
        return [f"{m['tokens_per_s']:.1f}", f"{m['speedup']:.2f}x"] if m else ["-", "-"]

    print_table(f"plain decoding: {spec.plain_tps:.1f} tokens/s; with the draft, at the best draft length (projected from "
                "the costs above; measured: served at that length with that acceptance made synthetic, beside a plain run)",
                ["acceptance from", "a per token", "best k", "tokens per step", "tokens/s", "x plain", "measured tokens/s",
                 "measured x plain", "at most x plain"],
                [[c.source, f"{c.acceptance:.3f}", str(c.best_k) if c.best_k else "0 (no draft)", f"{c.tokens_per_step:.2f}",
                  f"{c.tokens_per_s:.1f}", f"{c.speedup:.2f}x", *measured(c),
                  f"{c.bound_speedup:.2f}x (k {c.bound_k})" if c.bound_k else "1.00x"] for c in spec.choices])
    print("at most: the best draft length if every verify forward cost only the weights it must read (its tokens sent "
          "to experts independently) and drafting were free; no kernel does better, trained routing that reuses "
          "experts across neighbouring tokens can (docs/performance.md)")
    failed = next((c.measured["error"] for c in spec.choices if c.measured and "error" in c.measured), None)
    if failed:
        print(f"measured: not run ({failed}); the projection stands unchecked")


@bench_app.command("profile")
def profile_cmd(model: ModelArg, as_json: JsonFlag = False) -> None:
    """The kernels of one decode step, timed per CUDA graph node by ncu (needs a CUDA build and ncu on PATH)."""
    from ..bench.profile import profile_decode_step

    step = profile_decode_step(model)
    if as_json:
        print(json.dumps(step.as_row(), indent=2))
        return
    print_table(f"one decode step of {step.model}: {step.kernels} kernels, {step.us:.0f} us of kernel time (ncu, caches warm)",
                ["kernel", "launches", "us", "share"],
                [[r.family, str(r.count), f"{r.us:.1f}", f"{100 * r.us / max(step.us, 1e-9):.1f} %"] for r in step.rows])


@bench_app.command("tune")
def tune_cmd(
    model: ModelArg,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length per request.")] = 512,
    gen_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 64,
    repeat: Annotated[int, typer.Option(help="Requests per candidate.")] = 2,
    ctx_size: Annotated[int, typer.Option(help=f"The {POOL_HELP}, the same for every candidate.")] = 4096,
) -> None:
    """Try split modes, batch sizes, flash attention and GPU counts; print the fastest as a serve command."""
    from ..bench import tune as bench_tune

    print(f"{'candidate':<34} {'prefill t/s':>12} {'decode t/s':>11} {'TTFT s':>8}")

    def show(row) -> None:
        if row.result is None:
            print(f"{row.candidate.label:<34} failed: {row.error}")
        else:
            r = row.result
            print(f"{row.candidate.label:<34} {r.prefill_tps:>12.1f} {r.decode_tps:>11.1f} {r.ttft_s:>8.3f}")
        sys.stdout.flush()

    rows = bench_tune.tune(model, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, repeat=repeat, ctx_size=ctx_size, on_row=show)
    best = bench_tune.winner(rows)
    base = rows[0].result
    gain = f" ({best.result.decode_tps / base.decode_tps:.2f}x decode vs llama.cpp's defaults)" if base and base.decode_tps else ""
    if best is rows[0]:  # the defaults, kept
        print(f"fastest: llama.cpp's defaults (nothing beat them by more than {bench_tune.MIN_GAIN:.0%}, this run's noise level)")
    else:
        print(f"fastest: {best.candidate.label}{gain}")
    print(f"  {bench_tune.serve_command(model, best.candidate)}")


def legacy_argv(args: list[str]) -> list[str]:
    """``bench ...`` in the one-command spelling of earlier releases -> the subcommand it meant.

    ``--profile`` -> profile, ``--verify-cost K`` -> verify, ``--spec-args A`` -> draft, a ``--concurrency`` list or
    ``--parallel`` -> concurrency, else run. Options no subcommand takes are passed on, so typer names them.
    """
    from ..bench.client import BenchError

    if not args or args[0] in SUBCOMMANDS or args[0] in ("--help", "-h"):
        return args
    rest = list(args)
    names = {a.partition("=")[0] for a in rest}
    modes = [m for m in ("--verify-cost", "--spec-args", "--profile") if m in names]
    if len(modes) > 1:
        raise BenchError(f"{' and '.join(modes)} are separate benchmarks: run one at a time")
    if modes and "--url" in names:
        raise BenchError(f"{modes[0]} starts the model itself: give a MODEL instead of --url")
    if modes == ["--profile"]:
        rest.remove("--profile")
        return ["profile", *rest]
    if modes:
        return ["verify" if modes == ["--verify-cost"] else "draft", *rest]
    levels = next((v for i, a in enumerate(rest) for v in [a.partition("=")[2] if a.startswith("--concurrency=") else
                   (rest[i + 1] if a == "--concurrency" and i + 1 < len(rest) else None)] if v is not None), None)
    if "--parallel" in rest or any(a.startswith("--parallel=") for a in rest) or (levels is not None and "," in levels):
        return ["concurrency", *rest]
    return ["run", *rest]
