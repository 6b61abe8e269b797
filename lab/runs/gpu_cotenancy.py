"""Co-tenancy (issue 55 items 5 and 3): what one long prompt does to a stream decoding beside it, per scheduling
setting, under the A100 dispatch and natively; then how much of the GPU a decode step leaves idle.

    python -m lab.runs.gpu_cotenancy [--work /tmp/dec] [--site /tmp/pkg] [--columns pyllm@a100,pyllm]
        [--models v4-43l] [--settings baseline,defaults,target50,target100] STAGE...   (all = models rows ncu)

models   write the --models files that are missing (lab/bench/lab_models.py: WORK/NAME.gguf, seed 42)
rows     per model, column and setting, one `pyllm serve` server (the package's Server: its memory plan and defaults,
         --ctx-size, --parallel = the load's slots: the stream, the long prompts, the short request) with the setting's
         llama-server flags; then pyllm_a100.bench.cotenancy.measure (`pyllm bench cotenancy`'s library): a stream
         decodes alone (solo_tps), then --prompts prompts of --prompt-tokens tokens are sent beside it (during_tps, the
         stream's gaps p50/p99/max, prefill_s) and a --short-tokens request once they are under way (short_ttft_s).
         Settings: baseline = llama.cpp's own scheduling (serve.options.LLAMA_CPP_SCHEDULING: no --batch-size or
         --decode-latency-target, so llama-server's -b 2048 and target off; --baseline-args adds flags), defaults =
         pyllm serve's own, targetN = --decode-latency-target N, or NAME='FLAGS' given with --setting. Every row also gets its model's and column's baseline prefill
         (baseline_prefill_s) and whether the stream's greedy tokens match the baseline's over the tokens both got.
ncu      (last, optional) per --ncu-columns: ncu --graph-profiling node over the package's llama-bench on --ncu-model,
         one decode step (-p 0 -n 1) and one prompt chunk (-p --ncu-chunk -n 0), per launch: duration, SM throughput,
         achieved occupancy, the SMs' active share, DRAM throughput (lab/bench/idle.py); the step's idle shares.
report   the rows as a table; $OUT/gpu-cotenancy.json.
Columns: pyllm@DISPATCH (lab/bench/served.py): under pyllm@a100 each llama-server (and llama-bench under ncu) runs with
lab/scripts/a100-dispatch.c preloaded. WORK/results/gpu-cotenancy.json is written after every row (atomically), with
this run's command, each server's argv and the dispatch and compute capability each reported.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time

from lab.bench import dispatch as dsp
from lab.bench import lab_models, served
from lab.bench import stages

D = dsp.Dispatcher()  # main() replaces it from --dispatch / --dispatch-shim
RESULT = "gpu-cotenancy.json"
KEPT_TOKENS = 256  # the stream's first tokens kept in a row (the comparison with the baseline's)
FIELDS = ("solo_tps", "during_tps", "gap_p50_ms", "gap_p99_ms", "gap_max_ms", "prefill_s", "short_ttft_s")


def setting_args(a, name: str) -> list[str]:
    """A setting's llama-server flags (beyond pyllm serve's own)."""
    if name == "baseline":
        return list(a.baseline_args)
    if name == "defaults":
        return []
    if name in a.setting:
        return a.setting[name]
    if name.startswith("target") and name[6:].isdigit():
        return ["--decode-latency-target", name[6:]]
    raise ValueError(f"--settings {name}: use baseline, defaults, targetN (ms) or one named with --setting NAME='FLAGS'")


def finish(rows: list[dict]) -> None:
    """Each row's baseline figures: the baseline row of its model and column."""
    for r in rows:
        if "ncu" in r.get("kind", ""):
            continue
        base = next((b for b in rows if b.get("setting") == "baseline" and b["model"] == r["model"]
                     and b["column"] == r["column"] and b.get("scenario") == r.get("scenario")
                     and b.get("prefill_s") is not None), None)
        r["baseline_prefill_s"] = base["prefill_s"] if base else None
        r["prefill_vs_baseline"] = round(r["prefill_s"] / base["prefill_s"], 3) if base and r.get("prefill_s") else None
        mine, theirs = r.get("stream_tokens") or [], (base or {}).get("stream_tokens") or []
        n = min(len(mine), len(theirs))
        r["same_stream_tokens_as_baseline"] = (mine[:n] == theirs[:n]) if base and n else None


def results(a) -> lab_models.Results:
    header = {"generated_by": "python -m lab.runs.gpu_cotenancy", "command": a.command,
              "load": {"prompts": a.prompts, "prompt_tokens": a.prompt_tokens, "short_tokens": a.short_tokens,
                       "streams": a.streams},
              "server": {"ctx_size": a.ctx_size, "baseline_args": a.baseline_args}}
    return lab_models.Results(os.path.join(a.work, "results", RESULT), ("kind", "model", "column", "setting", "scenario"),
                              header, finish)


def row_for(a, model: str, col: str, disp: str, setting: str) -> dict:
    from pyllm_a100.bench.cotenancy import Load, measure
    from pyllm_a100.serve.options import LLAMA_CPP_SCHEDULING
    from pyllm_a100.serve.server import Server

    load = Load(prompts=a.prompts, prompt_tokens=a.prompt_tokens, short_tokens=a.short_tokens, streams=a.streams)
    extra = setting_args(a, setting) + a.server_args
    label = lab_models.label(model)
    log = os.path.join(a.work, "cot", f"{label}-{col}-{setting}.log")
    if os.path.exists(log):
        os.unlink(log)
    env = served.child_env(D, disp)
    row = {"kind": "serve", "dispatch": disp, "column": col, "model": label,
           "layers": lab_models.layers(lab_models.path(a.work, model)), "setting": setting, "server_args": extra,
           "scenario": scenario(load), "alone": a.alone,
           "load": {"prompts": load.prompts, "prompt_tokens": load.prompt_tokens, "short_tokens": load.short_tokens,
                    "streams": load.streams},
           "ctx_size": a.ctx_size, "parallel": load.slots, **{f: None for f in FIELDS}}
    t0 = time.time()
    # the baseline: llama-server's own scheduling (no pyllm serve flags for it; --baseline-args on top)
    scheduling = dict(LLAMA_CPP_SCHEDULING) if setting == "baseline" else {}
    try:
        with Server(lab_models.path(a.work, model), port=0, ready_timeout=a.ready_timeout, ctx_size=a.ctx_size,
                    parallel=load.slots, extra_args=extra, env=env, log_path=log, **scheduling) as srv:
            row["argv"] = shlex.join(srv.argv)
            row["load_s"] = round(time.time() - t0, 1)
            capacity = srv.config.capacity
            if capacity is not None and capacity.per_slot < load.prompt_tokens + 8:
                raise RuntimeError(f"a slot holds {capacity.per_slot} tokens, the long prompt {load.prompt_tokens}: "
                                   "raise --ctx-size")
            result = measure(srv.base_url, load, server=f"{label} {col} {setting}", api_key=srv.api_key)
        row.update({f: round(v, 3) if isinstance(v, float) else v for f, v in result.as_row().items() if f in FIELDS},
                   kept=round(result.kept, 4), stream_tokens=list(result.stream_tokens[:KEPT_TOKENS]),
                   streams=result.streams, failed_streams=result.failures,
                   stream_tokens_total=len(result.stream_tokens))
    except Exception as e:  # recorded; the next rows still run
        row["error"] = f"{type(e).__name__}: {e}"[-1500:]
    row["seconds"] = round(time.time() - t0, 1)
    row.update(served.record(disp, log, env), log=log)
    return row


def scenario(load) -> str:
    """A row's load in a word: ``1x65536`` (one prompt beside one stream), ``4x32768+16s`` (four beside 16 streams)."""
    return f"{load.prompts}x{load.prompt_tokens}" + (f"+{load.streams}s" if load.streams > 1 else "")


def stage_models(a, w, res):
    res["written"] = lab_models.write(w, a.models)


def stage_rows(a, w, res):
    rs = results(a)
    for model in a.models:
        for col, disp in served.columns(a.columns, a.dispatch):
            for setting in a.settings:
                row = row_for(a, model, col, disp, setting)
                rs.put(row)
                print(f"{row['model']} {col} {setting}: solo {row['solo_tps']} during {row['during_tps']} tok/s, gap p50 "
                      f"{row['gap_p50_ms']} max {row['gap_max_ms']} ms, prefill {row['prefill_s']} s (baseline "
                      f"{row['baseline_prefill_s']}), short ttft {row['short_ttft_s']} s"
                      + (f"  ERROR {row['error'][:300]}" if row.get("error") else ""), flush=True)
    failed = [r for r in rs.rows if r.get("error") and r["kind"] == "serve"]
    if failed:
        raise RuntimeError(f"{len(failed)} row(s) failed: {failed[0]['error'][:300]}")


def gpu_sms() -> int | None:
    """The GPU's SM count by its name (nvidia-smi has no query for it): the few-block share's threshold."""
    if not shutil.which("nvidia-smi"):
        return None
    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout
    return next((n for key, n in (("H200", 132), ("H100", 132), ("A100", 108), ("A800", 108)) if key in name), None)


def stage_ncu(a, w, res):
    from lab.bench import idle

    if not shutil.which("ncu"):
        raise RuntimeError("ncu (Nsight Compute) is not on PATH")
    rs = results(a)
    model = lab_models.path(w, a.ncu_model)
    bench = str(served.native() / "llama-bench")
    common = ["-m", model, "-r", "1", "--no-warmup", "-ngl", "99", "-fa", "1", "-b", "2048", "-ub", str(a.ncu_chunk)]
    for col, disp in served.columns(a.ncu_columns, a.dispatch):
        env = served.child_env(D, disp)
        row = {"kind": "ncu", "model": lab_models.label(a.ncu_model), "column": col, "dispatch": disp, "setting": None}
        for what, args in (("decode", ["-p", "0", "-n", "1"]), ("prefill", ["-p", str(a.ncu_chunk), "-n", "0"])):
            log = os.path.join(w, "cot", f"ncu-{row['model']}-{col}-{what}")
            try:
                row[what] = idle.profile([bench, *common, *args], log, env, a.ncu_launch_count, gpu_sms())
                text = open(f"{log}.{row[what]['how']}.stdout", errors="replace").read()
                row.setdefault("dispatch_record", dsp.record(disp, text))
            except Exception as e:
                row[what] = {"error": f"{type(e).__name__}: {e}"[-800:]}
        solo = next((r.get("solo_tps") for r in rs.rows if r["kind"] == "serve" and r["model"] == row["model"]
                     and r["column"] == col and r.get("solo_tps")), None)
        if solo and row["decode"].get("kernel_ms"):  # the step's host time between kernels, against a served step
            row["step_ms"] = round(1000 / solo, 3)
            row["kernel_share_of_step"] = round(row["decode"]["kernel_ms"] / row["step_ms"], 4)
        rs.put(row)
        d = row["decode"]
        print(f"ncu {row['model']} {col}: decode {d.get('launches')} launches, {d.get('kernel_ms')} ms, SMs idle "
              f"{d.get('sm_idle_share')}, issue idle {d.get('issue_idle_share')}{' ' + d['error'] if 'error' in d else ''}",
              flush=True)


def stage_report(a, w, res):
    def line(r: dict) -> str | None:
        if r["kind"] != "serve":
            return None
        cells = [r[k] or "-" for k in ("solo_tps", "during_tps", "gap_p50_ms", "gap_max_ms", "prefill_s", "baseline_prefill_s",
                                       "short_ttft_s")]
        return (f"{r['model']:<10} {r['column']:<11} {r['setting']:<10} " + " ".join(f"{c:>8}" for c in cells)
                + ("  ERROR" if r.get("error") else ""))

    heading = f"{'model':<10} {'column':<11} {'setting':<10} " + " ".join(
        f"{h:>8}" for h in ("solo", "during", "p50 ms", "max ms", "prefill", "base", "short"))
    lab_models.report(os.path.join(w, "results", RESULT), heading, line)


STAGES = {"models": stage_models, "rows": stage_rows, "ncu": stage_ncu, "report": stage_report}


def named(text: str) -> tuple[str, list[str]]:
    name, sep, flags = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"--setting {text!r}: write NAME='LLAMA-SERVER FLAGS', e.g. b512='-b 512 -ub 512'")
    return name, shlex.split(flags)


def main() -> int:
    ap = served.parser(__doc__, list(STAGES), "v4-43l", 262144)
    ap.add_argument("--settings", default="baseline,defaults,target50,target100", help="rows per model and column, in order")
    ap.add_argument("--setting", type=named, action="append", default=[], help="NAME='FLAGS': a setting of your own")
    ap.add_argument("--baseline-args", type=shlex.split, help="the baseline's llama-server flags (default: the library's "
                    "BASELINE_ARGS, llama.cpp's own scheduling)")
    ap.add_argument("--prompts", type=int, default=1, help="long prompts sent at once beside the stream")
    ap.add_argument("--streams", type=int, default=1, help="streams decoding beside them (the first one is timed)")
    ap.add_argument("--not-alone", dest="alone", action="store_false", help="the GPU runs another job at the same time: "
                    "each row says so (\"alone\": false)")
    ap.add_argument("--prompt-tokens", type=int, default=65536, help="each long prompt's length")
    ap.add_argument("--short-tokens", type=int, default=200, help="the short request sent during the prefill (0: none)")
    ap.add_argument("--ncu-columns", default="pyllm@a100")
    ap.add_argument("--ncu-model", default="v4-43l")
    ap.add_argument("--ncu-chunk", type=int, default=512, help="ncu: the prompt chunk's tokens (and -ub)")
    ap.add_argument("--ncu-launch-count", type=int, default=0, help="ncu: profile at most this many launches a pass "
                    "(0: all; a 43-layer step is ~3,500)")
    a = ap.parse_args()
    try:
        a.models = lab_models.check(a.models.split(","))
        lab_models.check([a.ncu_model])
        a.setting = dict(a.setting)
        a.settings = [s for s in a.settings.split(",") if s]
        served.columns(a.columns, a.dispatch), served.columns(a.ncu_columns, a.dispatch)
        for s in a.settings:
            if s != "baseline":
                setting_args(a, s)
    except (ValueError, dsp.DispatchError) as e:
        ap.error(str(e))
    served.prepare(a)
    if a.baseline_args is None and [s for s in a.stages if s in ("rows", "all")]:
        try:
            from pyllm_a100.bench.cotenancy import BASELINE_ARGS
        except ImportError:
            ap.error("pyllm_a100.bench.cotenancy is missing from this build of the package (`pyllm bench cotenancy` "
                     "comes with issue 55's patch): install one that has it")
        a.baseline_args = list(BASELINE_ARGS)
    global D
    D = dsp.from_args(a, build_dir=a.work)
    a.command = shlex.join(stages.command("lab.runs.gpu_cotenancy", sys.argv[1:]))
    os.makedirs(os.path.join(a.work, "cot"), exist_ok=True)
    return stages.run(stages.expand(a.stages, ["models", "rows", "ncu"]), STAGES, a, a.work, os.path.join(a.work, "cot"),
                      {"command": a.command})


if __name__ == "__main__":
    sys.exit(main())
