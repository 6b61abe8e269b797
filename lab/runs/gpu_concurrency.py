"""Aggregate tokens/s under concurrency, pin vs patched, one GPU (issue 23 item 4), with the forwards each level cost.

    python -m lab.runs.gpu_concurrency WORK [MODEL] [LEVELS] [SWITCHES] [--columns pin,patched,patched+SLOTLRU] [--parallel 32]
        [--graph-count graph-count.so] [--dispatch native|a100] [--dispatch-shim PATH]
    # after python -m lab.runs.gpu_decode build models; MODEL default WORK/v4-43l.gguf, LEVELS 1,8,16,32; SWITCHES: the switches
    # (lab/bench/decode_switches.py) of every patched column, e.g. OCCUPANCY+FATILES8

Each column's llama-server (BUILD[+SWITCH...]: -ngl 99 -fa on --fit off, --parallel N = -np N with 512 tokens per
slot; Nu adds --kv-unified) in the columns' order, then reversed (pin, patched, patched, pin by default: a drift of
the machine shows as a difference between the two runs of one column); `pyllm bench`'s measure() against it, 256-token
prompts, 64 tokens, 2 requests per stream. With --graph-count (lab/scripts/graph-count.c built as a shared library) each
level also records how many graph evaluations (ubatches) the server ran and forwards_per_step = forwards x streams /
generated tokens (1.0 when every step of N streams is one forward; prompts add a little). Columns may name their
dispatch (issue 41): --columns pin,patched,pin@a100,patched@a100 runs the A100-dispatch servers with
lab/scripts/a100-dispatch.c preloaded (--dispatch a100: the default of columns without @); every run records its dispatch
and the compute capability its llama-server logged. Writes $OUT/concurrency.json.
"""
import argparse, json, os, sys, tempfile
from pathlib import Path
from pyllm_a100.bench.concurrency import BenchError, measure, parse_levels, scaling
from lab.bench import dispatch as dsp
from lab.bench.decode_switches import ENV_COLUMNS
from lab.gpucheck.build_server import BuildServer
from pyllm_a100.home import write_json_atomic

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("work"); ap.add_argument("model", nargs="?"); ap.add_argument("levels", nargs="?", default="1,8,16,32")
ap.add_argument("switches", nargs="?", default="", help="switches of every patched column (NAME[+NAME...])")
ap.add_argument("--columns", default="pin,patched", help="BUILD[+SWITCH...] columns, run in order then reversed")
ap.add_argument("--parallel", default="32", help="slots: N (-np N, the context split) or Nu (N slots, --kv-unified)")
ap.add_argument("--graph-count", help="the graph-count shim (.so): record the forwards of each level")
dsp.add_arguments(ap)
a = ap.parse_args()
w, model = a.work, a.model or f"{a.work}/v4-43l.gguf"
DISPATCH = dsp.from_args(a, build_dir=w)
try:
    levels = parse_levels(a.levels, option="LEVELS")
    specs = [DISPATCH.split(c) for c in a.columns.split(",")]  # (BUILD[+SWITCH...], dispatch)
except (BenchError, dsp.DispatchError) as e:
    sys.exit(str(e))
bases = [b + (f"+{a.switches}" if a.switches and b.split("+")[0] != "pin" else "") for b, _ in specs]
cols = [dsp.column_name(b, d) for b, (_, d) in zip(bases, specs)]
unknown = {n for b in bases for n in b.split("+")[1:]} - set(ENV_COLUMNS)
if unknown or not a.parallel.rstrip("u").isdigit() or int(a.parallel.rstrip("u")) < 1:
    sys.exit(f"unknown switch {sorted(unknown)}: use {', '.join(ENV_COLUMNS)} (BUILD+NAME[+NAME...])" if unknown
             else f"--parallel {a.parallel!r}: give N or Nu, e.g. 32 or 16u")
n_slots, unified = int(a.parallel.rstrip("u")), a.parallel.endswith("u")
counter = os.path.join(tempfile.mkdtemp(), "graph-count")


def forwards() -> int:
    with open(counter, "rb") as f:
        return int.from_bytes(f.read(8), "little")


runs = []
for i, col in enumerate(cols + cols[::-1]):
    base, disp = DISPATCH.split(col)
    build, *names = base.split("+")
    env = {k: v for n in names for k, v in ENV_COLUMNS[n].items()}
    inherited = ":".join(filter(None, [os.environ.get("LD_PRELOAD"), os.path.abspath(a.graph_count) if a.graph_count else ""]))
    env.update(DISPATCH.env(disp, inherited=inherited))  # the shim first (a100), then graph-count
    if a.graph_count:
        env.update(GRAPH_COUNT_FILE=counter)
    server = BuildServer(f"{w}/{build}-bin", ["-m", model, "-ngl", "99", "-fa", "on", "--fit", "off", "-np", str(n_slots),
                         "-c", str(n_slots * 512), "--no-warmup"] + (["--kv-unified"] if unified else []),
                         log_path=f"{w}/conc-{i}-{col}.log", extra_env=env)
    run = {"build": col, "dispatch": disp, "parallel": a.parallel, "argv": " ".join(server.argv[1:])}
    marks: dict[int, int] = {}
    try:
        server.start()
        rows = measure(server.base_url, levels, prompt_tokens=256, gen_tokens=64, requests_per_stream=2, slots=a.parallel,
                       on_level_start=(lambda n: marks.__setitem__(n, forwards())) if a.graph_count else None)
        result = [r.as_row() for r in rows]
        if a.graph_count:  # the level's forwards: from its start mark to the next level's (the last: to now)
            ends = [marks[n] for n in levels[1:]] + [forwards()]
            for r, n, end in zip(result, levels, ends):
                r["forwards"] = end - marks[n]
                r["forwards_per_step"] = round(r["forwards"] * n / r["generated_tokens"], 2) if r["generated_tokens"] else None
        for r, ratio in zip(result, scaling(rows).values()):  # aggregate / the lowest level's, as pyllm bench reports it
            r["scaling"] = ratio
        run["result"] = {"prompt_tokens": 256, "gen_tokens": 64, "requests_per_stream": 2, "levels": result,
                         "failures": sum(r["failures"] for r in result)}
    except Exception as e:
        run["error"] = f"{type(e).__name__}: {e}"
    finally:
        server.stop()
        log = f"{w}/conc-{i}-{col}.log"
        run.update(dsp.server_record(disp, open(log, errors="replace").read() if os.path.exists(log) else "",
                                     f"{w}/{build}-bin", dict(os.environ, **env)))
    runs.append(run)
    print(col, run.get("error") or json.dumps([{k: r[k] for k in ("concurrency", "aggregate_tps", "failures", "forwards",
                                                "forwards_per_step") if k in r} for r in run["result"]["levels"]]), flush=True)
    out = {"model": os.path.basename(model), "levels": a.levels, "parallel": a.parallel, "columns": cols, "runs": runs,
           "dispatch": {r["build"]: r["dispatch"] for r in runs},
           "reported_capability": {r["build"]: r.get("reported_capability") for r in runs}}
    # after every column (atomically), so that a call cut short keeps the columns it measured
    write_json_atomic(Path(w) / f"results-concurrency-{a.parallel}.json", out)
os.makedirs(os.environ.get("OUT", w), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", w), "concurrency.json"), "w"), indent=1)
failed = [r["build"] for r in runs if "error" in r]
if failed:  # the figures of the runs that worked are written above; the job still says the level table is incomplete
    sys.exit(f"gpu-concurrency: {len(failed)} of {len(runs)} runs failed ({', '.join(sorted(set(failed)))}): their logs are {w}/conc-*.log")
