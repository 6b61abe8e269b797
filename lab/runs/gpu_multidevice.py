"""Several devices on one GPU (issue 56 item 2): `pyllm rpc-worker`s beside the local device, `pyllm serve --rpc ...
--tensor-split 1xN` over them, checked against one device; and first of all the RPC crash fix (patch 0043).

    python -m lab.runs.gpu_multidevice [--work /tmp/dec] [--site /tmp/pkg] [--columns pyllm@a100,pyllm]
        [--models v4-43l,glm5-12l,v32-16l] [--devices 1,2,4,8] STAGE...   (all = models rpccheck grid inprocess ubsweep)

models     write the --models files that are missing (lab/bench/lab_models.py: WORK/NAME.gguf, seed 42)
rpccheck   per column: one rpc-worker, then `llama-server --rpc HOST:PORT --list-devices` 3 times (exit 0 with an RPC
           device listed; before 0043 it died 3 of 3), `nm -D --defined-only` of every library of the build for
           call_once's trampoline (_Prepare_execution), and LD_DEBUG=bindings for libstdc++'s once-state (__once_*):
           which library each binding went to (0043's root cause). The grid does not start after a failed check.
grid       per column, model and N of --devices. N = 1: the build's own device alone, no --rpc (CUDA0; the CPU build's
           CPU): the reference. N >= 2: `pyllm serve --rpc W1,.. --tensor-split 1xN` over N - L workers (L: 1 local GPU
           on a CUDA build, 0 on the CPU build), each `pyllm rpc-worker --device CUDA0` in its own process and CUDA
           context, started once per column and model. Every server runs with -lv 5 (llama.cpp logs each layer's device
           and every buffer). Per row: greedy tokens of three prompts with the top-two log-probabilities at every
           position, against the reference (where they part, the reference's gap there: a near tie at <= --tie nats);
           layers per device from the log against the split (llama.cpp's model order: RPC devices first) and against the
           product's plan (ServerConfig.device_plan, by device name); model and KV MiB per device against that plan;
           one stream's decode tok/s; the crash sweep (each prompt length of --sweep, 4 tokens); --streams streams at
           once (pyllm_a100.bench.concurrency.measure); errors and crashes (the server or a worker found dead).
inprocess  per column, model and N of --inprocess-devices: pyllm_a100.Llama over the same workers and split, in a child
           process (lab/bench/rpc_inprocess.py), its greedy tokens against the reference row's.
ubsweep    per column, model and N of --ub-devices, for each -ub of --ub: a server started with it, each prompt length
           of --ub-sweep and --ub-streams streams at once: errors and crashes (a restart per value: choose a subset).
report     the rows as a table; $OUT/gpu-multidevice.json.
Rows (WORK/results/gpu-multidevice.json, written after every row; a row replaces the one of the same kind, model,
devices, column and -ub): model, layers, devices, dispatch, same_tokens, crashes, errors, decode_tps,
layers_per_device, and how each was measured, with the exact commands (this run's, the server's, the workers').
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lab.bench import dispatch as dsp
from lab.bench import lab_models, served
from lab.bench import multidevice as md
from lab.bench import stages

D = dsp.Dispatcher()  # main() replaces it from --dispatch / --dispatch-shim
RESULT = "gpu-multidevice.json"
EVERY = ["models", "rpccheck", "grid", "inprocess", "ubsweep"]


# --- the workers ------------------------------------------------------------------------------


class Workers:
    """rpc-workers of one dispatch (the package's RpcWorker: `pyllm rpc-worker` in the foreground), started as needed
    and kept for the rows after; a dead one is counted and replaced."""

    def __init__(self, a: argparse.Namespace, col: str, disp: str) -> None:
        self.a, self.col, self.env, self.procs = a, col, served.child_env(D, disp), []

    def _one(self, i: int):
        from pyllm_a100.process.net import free_port
        from pyllm_a100.rpc.worker import RpcWorker, WorkerOptions

        w = RpcWorker(WorkerOptions(port=free_port(), device=worker_device(self.a)),
                      log_path=os.path.join(self.a.work, "md", "logs", f"worker-{self.col}-{i}-{time.time():.0f}.log"), env=self.env)
        return w.start()

    def endpoints(self, n: int) -> list[str]:
        # one after the other from this thread: a child gets SIGKILL when the thread that started it ends
        # (PR_SET_PDEATHSIG), so no thread pool
        self.procs += [self._one(i) for i in range(len(self.procs), n)]
        return [str(w.config.endpoint) for w in self.procs[:n]]

    def commands(self, n: int) -> list[str]:
        return [f"pyllm rpc-worker --port {w.config.port}" + (f" --device {w.config.device}" if w.config.device else "")
                for w in self.procs[:n]]

    def capabilities(self, n: int) -> list[str | None]:
        """The compute capability each of the first n workers' ggml-cuda logged (8.0 under the A100 dispatch)."""
        return [dsp.reported_capability(w.log_path.read_text(errors="replace")) if w.log_path and w.log_path.is_file()
                else None for w in self.procs[:n]]

    def dead(self, n: int) -> list[str]:
        """Endpoints of the first n workers that died; they are replaced for the next row."""
        gone = [i for i, w in enumerate(self.procs[:n]) if w.proc is None or w.proc.poll() is not None]
        out = [str(self.procs[i].config.endpoint) for i in gone]
        for i in gone:
            self.procs[i].stop()
            self.procs[i] = self._one(i)
        return out

    def stop(self) -> None:
        for w in self.procs:
            w.stop()
        self.procs = []


# --- one server row ---------------------------------------------------------------------------


def worker_device(a: argparse.Namespace) -> str | None:
    """Each worker's --device: as given, else CUDA0 on a CUDA build (none on the CPU build: rpc-server offers its CPU)."""
    if a.worker_device is not None:
        return a.worker_device or None
    from pyllm_a100.llamacpp.native import build_info

    return "CUDA0" if build_info().get("cuda") else None


def local_devices(a: argparse.Namespace) -> list[str]:
    if a.local_devices is not None:
        return [f"CUDA{i}" for i in range(a.local_devices)]
    from pyllm_a100.llamacpp.native import build_info

    return ["CUDA0"] if build_info().get("cuda") else []


def prompts_for(url: str, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """The same token ids for every server of a run (seeded), within the model's vocabulary."""
    from pyllm_a100.bench.client import _vocab_size

    with httpx.Client() as client:
        n_vocab = _vocab_size(client, url)
    rng, low = random.Random(seed), min(300, n_vocab // 4)
    return [[rng.randrange(low, n_vocab) for _ in range(n)] for n in lengths]


def alive(srv) -> bool:
    return srv.proc is not None and srv.proc.poll() is None


def sweep(url: str, srv, lengths: list[int], key: str | None) -> dict:
    """Each prompt length once (4 tokens): failed requests; stops at a dead server."""
    from pyllm_a100.bench.draft_exactness import greedy

    failed, first = 0, None
    for prompt in prompts_for(url, lengths, seed=1):
        try:
            greedy(url, prompt, 4, api_key=key, timeout=300)
        except Exception as e:
            failed += 1
            first = first or f"{len(prompt)} tokens: {type(e).__name__}: {e}"[:300]
            if not alive(srv):
                failed += len(lengths) - lengths.index(len(prompt)) - 1
                break
    return {"lengths": f"{lengths[0]}-{lengths[-1]}" if lengths == list(range(lengths[0], lengths[-1] + 1)) else lengths,
            "errors": failed, "first_error": first}


def streams(url: str, n: int, key: str | None, prompt_tokens: int = 64, gen: int = 16) -> dict:
    from pyllm_a100.bench.concurrency import measure

    row = measure(url, [n], prompt_tokens=prompt_tokens, gen_tokens=gen, requests_per_stream=1, api_key=key)[0]
    return {"n": n, "requests": row.requests, "failures": row.failures, "aggregate_tps": round(row.aggregate_tps, 1),
            "first_error": row.first_error}


def start(a, model: str, n: int, eps: list[str], env: dict, log: str, extra: list[str]):
    from pyllm_a100.serve.server import Server

    opts = dict(port=0, ctx_size=a.ctx_size, parallel=a.parallel, extra_args=extra, env=env, log_path=log,
                ready_timeout=a.ready_timeout)
    if eps:
        opts.update(rpc=",".join(eps), tensor_split=f"1x{n}")
    return Server(lab_models.path(a.work, model), **opts)


def checks(a, row: dict, srv, ref: dict | None) -> int:
    """The row's measurements on a started server; the failed requests."""
    from pyllm_a100.bench.draft_exactness import greedy

    url, key, errors, t0 = srv.base_url, srv.api_key, 0, time.time()
    tokens, top2, prompts = [], [], prompts_for(url, [8, 64, a.prompt_tokens])
    for prompt in prompts:
        got, probs = md.greedy_top2(url, prompt, a.gen, api_key=key)
        tokens.append(got)
        top2.append([[round(x, 5) for x in p] for p in probs])
    row.update(tokens=tokens, top2=top2, prompts=prompts if row["devices"] == 1 else None)
    if ref is not None and ref.get("tokens"):
        row.update(md.compare(ref["tokens"], tokens, ref.get("top2") or [], top2, a.tie), reference=ref["devices"])
    phases = row["phase_s"] = {"tokens": round(time.time() - t0, 1)}
    speeds = [greedy(url, prompts_for(url, [64], seed=2)[0], a.decode_tokens, api_key=key)[1].get("predicted_per_second", 0.0)
              for _ in range(2)]
    row["decode_tps"] = round(max(speeds), 2)
    phases["decode"] = round(time.time() - t0 - sum(phases.values()), 1)
    row["sweep"] = sweep(url, srv, md.parse_range(a.sweep, "--sweep"), key)
    errors += row["sweep"]["errors"]
    phases["sweep"] = round(time.time() - t0 - sum(phases.values()), 1)
    if alive(srv) and a.streams:
        row["streams"] = streams(url, a.streams, key)
        errors += row["streams"]["failures"]
        phases["streams"] = round(time.time() - t0 - sum(phases.values()), 1)
    return errors


def layout(a, row: dict, srv, log_text: str, eps: list[str], n_layer: int) -> None:
    """Where llama.cpp put layers and buffers (its log) against the split and the product's plan."""
    local = local_devices(a)
    order = md.model_order(eps, local) if eps else (local[:1] or ["CPU"])
    got = md.layer_assignment(log_text, n_layer)
    want = md.planned(n_layer, order)
    row.update(layers_per_device={d: got["layers"].get(d, 0) for d in order} if got["logged"] else None,
               output_device=got["output"], planned_layers=want["layers"], planned_output=want["output"],
               layers_as_split=got["logged"] and got["layers"] == {k: v for k, v in want["layers"].items() if v}
               and got["output"] == want["output"], model_order=order)
    plan = srv.config.device_plan() if srv is not None else []
    product = {d["name"]: d.get("layers") for d in plan if d.get("layers") is not None}
    row["product_plan_layers"] = product or None
    row["product_plan_matches"] = ({d: row["layers_per_device"].get(d, 0) for d in product} == product) \
        if product and row["layers_per_device"] else None
    logged = md.buffers(log_text, eps)
    row["buffers_mib"] = {d: v for d, v in logged.items() if d in order}
    mib = 1 << 20
    row["plan_mib"] = {d["name"]: {"weights": round(d["weights_bytes"] / mib, 1), "kv": round(d["kv_bytes"] / mib, 1)}
                       for d in plan if "weights_bytes" in d} or None
    if row["plan_mib"]:  # (logged - planned) / planned, %: the model buffer against the weights, KV against KV
        row["vs_plan_pct"] = {d: {k: round(100 * (logged.get(d, {}).get(lk, 0.0) - p[k]) / p[k], 1) if p[k] else None
                                  for k, lk in (("weights", "model"), ("kv", "kv"))} for d, p in row["plan_mib"].items()}


def serve_row(a, res: lab_models.Results, model: str, n: int, col: str, disp: str, workers: Workers) -> dict:
    local = local_devices(a)
    eps = workers.endpoints(n - len(local)) if n > 1 else []
    n_layer = lab_models.layers(lab_models.path(a.work, model))
    log = os.path.join(a.work, "md", "logs", f"{lab_models.label(model)}-{col}-{n}.log")
    Path(log).unlink(missing_ok=True)
    row = {"kind": "serve", "model": lab_models.label(model), "layers": n_layer, "devices": n, "dispatch": disp,
           "column": col, "ub": None, "workers": len(eps), "endpoints": eps, "worker_commands": workers.commands(len(eps)),
           "same_tokens": None, "crashes": 0, "errors": 0, "decode_tps": None, "layers_per_device": None}
    ref = None if n == 1 else res.find(kind="serve", model=row["model"], devices=1, column=col)
    t0, srv, errors = time.time(), None, 0
    try:
        srv = start(a, model, n, eps, served.child_env(D, disp), log, ["-lv", "5", *a.server_args])
        row["argv"] = shlex.join(srv.argv)
        srv.start()
        row["load_s"] = round(time.time() - t0, 1)
        errors += checks(a, row, srv, ref)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"[-1500:]
        errors += 1
    finally:
        up = srv is None or srv.proc is None or alive(srv)
        if srv is not None:
            srv.stop()
    row["worker_capability"] = workers.capabilities(len(eps))
    dead = workers.dead(len(eps))
    row.update(crashes=(0 if up else 1) + len(dead), errors=errors, dead_workers=dead, seconds=round(time.time() - t0, 1))
    text = Path(log).read_text(errors="replace") if Path(log).is_file() else ""
    layout(a, row, srv, text, eps, n_layer)
    row.update(served.record(disp, log, served.child_env(D, disp)), log=log)
    return row


# --- stages -----------------------------------------------------------------------------------


def results(a) -> lab_models.Results:
    header = {"generated_by": "python -m lab.runs.gpu_multidevice", "command": a.command,
              "settings": {k: getattr(a, k) for k in ("ctx_size", "parallel", "prompt_tokens", "gen", "decode_tokens",
                                                      "sweep", "streams", "tie", "worker_device")}}
    return lab_models.Results(os.path.join(a.work, "results", RESULT), ("kind", "model", "devices", "column", "ub"), header)


def each_column(a, models: list[str], body) -> None:
    """body(model, col, disp, workers) per column and model, one set of workers per column and model (a model's rows
    reuse them; stopped after, so the next model's load starts on idle workers)."""
    for col, disp in served.columns(a.columns, a.dispatch):
        for model in models:
            workers = Workers(a, col, disp)
            try:
                body(model, col, disp, workers)
            finally:
                workers.stop()


def stage_models(a, w, res):
    res["written"] = lab_models.write(w, a.models)


def stage_rpccheck(a, w, res):
    from pyllm_a100.llamacpp.native import build_info
    from pyllm_a100.process.net import free_port
    from pyllm_a100.rpc.worker import RpcWorker, WorkerOptions

    nat = served.native()
    counts = {}
    for lib in sorted(nat.glob("*.so")):
        p = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True)
        counts[lib.name] = sum("_Prepare_execution" in line for line in p.stdout.splitlines())
    res.update(prepare_execution=counts, prepare_execution_total=sum(counts.values()),
               patch_0043=any(p.startswith("0043-") for p in build_info().get("patches") or []), columns={})
    server = str(nat / "llama-server")
    for col, disp in served.columns(a.columns, a.dispatch):
        env = served.child_env(D, disp)
        worker = RpcWorker(WorkerOptions(port=free_port(), device=worker_device(a)), env=env,
                           log_path=os.path.join(w, "md", "logs", f"rpccheck-worker-{col}.log"))
        out: dict = {"runs": [], "command": f"llama-server --rpc ENDPOINT --list-devices"}
        try:
            worker.start()
            ep = str(worker.config.endpoint)
            for _ in range(3):
                p = subprocess.run([server, "--rpc", ep, "--list-devices"], capture_output=True, text=True, timeout=120, env=env)
                out["runs"].append({"rc": p.returncode, "devices": re.findall(r"^\s+(\w+): ", p.stdout, re.M),
                                    "tail": (p.stdout + p.stderr).strip().splitlines()[-3:]})
            p = subprocess.run([server, "--rpc", ep, "--list-devices"], capture_output=True, text=True, timeout=300,
                               env=dict(env, LD_DEBUG="bindings"), errors="replace")
            bound = re.findall(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \w+ symbol `([^']*(?:__once|_Prepare_execution)[^']*)'",
                               p.stdout + p.stderr)
            out["ld_debug"] = {"rc": p.returncode, "once_lines": sum("__once" in x for x in (p.stdout + p.stderr).splitlines()),
                               "bindings": sorted({f"{os.path.basename(f)} -> {os.path.basename(t)}: {s}" for f, t, s in bound})[:40]}
        finally:
            worker.stop()
        out["ok"] = bool(out["runs"]) and all(r["rc"] == 0 and any(d.startswith("RPC") for d in r["devices"]) for r in out["runs"])
        res["columns"][col] = out
    rs = results(a)
    rs.data["rpccheck"] = {k: v for k, v in res.items() if k not in ("started", "ok")}
    rs.save()
    failed = [c for c, o in res["columns"].items() if not o["ok"]]
    if failed:
        raise RuntimeError(f"llama-server --rpc ... --list-devices failed under {', '.join(failed)}: the RPC crash is not fixed "
                           "in this build (the grid will not start)")


def rpc_checked(w: str, force: bool) -> None:
    f = os.path.join(w, "md", "rpccheck.json")
    if os.path.exists(f) and not json.load(open(f)).get("ok") and not force:
        raise RuntimeError(f"{f} says the RPC check failed: fix the build first (or --force)")


def stage_grid(a, w, res):
    rpc_checked(w, a.force)
    rs = results(a)
    devices = sorted(a.devices, key=lambda n: n != 1)  # the reference first

    def body(model, col, disp, workers):
        for n in devices:
            row = serve_row(a, rs, model, n, col, disp, workers)
            rs.put(row)
            print(f"grid {row['model']} {col} {n} devices: same_tokens={row['same_tokens']} crashes={row['crashes']} "
                  f"errors={row['errors']} decode={row['decode_tps']} layers={row['layers_per_device']}"
                  + (f" error={row['error'][:200]}" if row.get("error") else ""), flush=True)

    each_column(a, a.models, body)
    res["rows"] = len(rs.rows)


def stage_inprocess(a, w, res):
    rpc_checked(w, a.force)
    rs = results(a)

    def body(model, col, disp, workers):
        label = lab_models.label(model)
        ref = rs.find(kind="serve", model=label, devices=1, column=col)
        if ref is None or not ref.get("prompts"):
            raise RuntimeError(f"no reference row (grid, 1 device, {label}, {col}): run the grid stage with --devices 1 first")
        n_layer = lab_models.layers(lab_models.path(w, model))
        for n in a.inprocess_devices:
            eps = workers.endpoints(n - len(local_devices(a)))
            prompts = os.path.join(w, "md", f"prompts-{label}-{col}.json")
            with open(prompts, "w") as f:
                json.dump(ref["prompts"], f)
            cmd = [sys.executable, "-m", "lab.bench.rpc_inprocess", lab_models.path(w, model), "--rpc", ",".join(eps),
                   "--tensor-split", f"1x{n}", "--prompts", prompts, "--gen", str(a.gen)]
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.ready_timeout, env=served.child_env(D, disp),
                               cwd=stages.REPO)
            row = {"kind": "inprocess", "model": label, "layers": n_layer, "devices": n, "dispatch": disp, "column": col,
                   "ub": None, "workers": len(eps), "endpoints": eps, "command": shlex.join(cmd),
                   "crashes": int(p.returncode < 0), "errors": int(p.returncode > 0), "decode_tps": None,
                   "same_tokens": None, "layers_per_device": None, "seconds": round(time.time() - t0, 1)}
            try:
                got = json.loads(p.stdout.strip().splitlines()[-1])
                row.update(md.compare(ref["tokens"], got["tokens"], ref.get("top2") or [], None, a.tie), how=got["how"],
                           tokens=got["tokens"], reference=1)
                layout(a, row, None, got["log"], eps, n_layer)
            except (ValueError, IndexError, KeyError) as e:
                row["error"] = f"{type(e).__name__}: {e}; rc={p.returncode}: {p.stderr[-1200:]}"
            row["dead_workers"] = workers.dead(len(eps))
            row["crashes"] += len(row["dead_workers"])
            rs.put(row)
            print(f"inprocess {label} {col} {n} devices: same_tokens={row['same_tokens']} layers={row['layers_per_device']}"
                  + (f" error={row['error'][:300]}" if row.get("error") else ""), flush=True)

    each_column(a, a.models, body)


def stage_ubsweep(a, w, res):
    rpc_checked(w, a.force)
    rs = results(a)

    def body(model, col, disp, workers):
        n_layer = lab_models.layers(lab_models.path(w, model))
        for n in a.ub_devices:
            eps = workers.endpoints(n - len(local_devices(a))) if n > 1 else []
            for ub in a.ub:
                log = os.path.join(w, "md", "logs", f"ub-{lab_models.label(model)}-{col}-{n}-ub{ub}.log")
                row = {"kind": "ub", "model": lab_models.label(model), "layers": n_layer, "devices": n, "dispatch": disp,
                       "column": col, "ub": ub, "workers": len(eps), "crashes": 0, "errors": 0, "decode_tps": None,
                       "same_tokens": None, "layers_per_device": None}
                srv, t0 = None, time.time()
                try:
                    srv = start(a, model, n, eps, served.child_env(D, disp), log, ["-ub", str(ub), *a.server_args])
                    row["argv"] = shlex.join(srv.argv)
                    srv.start()
                    row["sweep"] = sweep(srv.base_url, srv, md.parse_range(a.ub_sweep, "--ub-sweep"), srv.api_key)
                    row["errors"] += row["sweep"]["errors"]
                    if alive(srv) and a.ub_streams:
                        row["streams"] = streams(srv.base_url, a.ub_streams, srv.api_key)
                        row["errors"] += row["streams"]["failures"]
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[-1500:]
                    row["errors"] += 1
                finally:
                    up = srv is None or srv.proc is None or alive(srv)
                    if srv is not None:
                        srv.stop()
                row["dead_workers"] = workers.dead(len(eps))
                row.update(crashes=int(not up) + len(row["dead_workers"]), seconds=round(time.time() - t0, 1), log=log)
                rs.put(row)
                print(f"ubsweep {row['model']} {col} {n} devices -ub {ub}: crashes={row['crashes']} errors={row['errors']}",
                      flush=True)

    each_column(a, a.models, body)


def stage_report(a, w, res):
    def line(r: dict) -> str:
        return (f"{r['kind']:<9} {r['model']:<10} {r['column']:<11} {r['devices']:>3} {r.get('ub') or '':>3} "
                f"{str(r.get('same_tokens')):>5} {r['crashes']:>5} {r['errors']:>4} {r.get('decode_tps') or '':>7}  "
                f"{r.get('layers_per_device')}{' ERROR ' + r['error'][:120] if r.get('error') else ''}")

    lab_models.report(os.path.join(w, "results", RESULT), f"{'kind':<9} {'model':<10} {'column':<11} {'dev':>3} {'ub':>3} "
                      f"{'same':>5} {'crash':>5} {'err':>4} {'tok/s':>7}  layers per device", line)


STAGES = {"models": stage_models, "rpccheck": stage_rpccheck, "grid": stage_grid, "inprocess": stage_inprocess,
          "ubsweep": stage_ubsweep, "report": stage_report}


def main() -> int:
    ap = served.parser(__doc__, list(STAGES), "v4-43l,glm5-12l,v32-16l", 32768)
    ap.add_argument("--devices", default="1,2,4,8", help="grid: device counts (1: the reference, measured first)")
    ap.add_argument("--local-devices", type=int, help="local GPUs in every split (default: 1 on a CUDA build, else 0)")
    ap.add_argument("--worker-device", help="each worker's --device (default: CUDA0 on a CUDA build, none on the CPU build)")
    ap.add_argument("--parallel", type=int, default=16, help="the server's slots")
    ap.add_argument("--prompt-tokens", type=int, default=600, help="the longest of the three token-check prompts (8, 64, N)")
    ap.add_argument("--gen", type=int, default=32, help="tokens generated per token-check prompt")
    ap.add_argument("--decode-tokens", type=int, default=128, help="decode tok/s: tokens of one stream (best of 2)")
    ap.add_argument("--tie", type=float, default=0.02, help="a parting of tokens is a near tie when the reference's top "
                    "two log-probabilities there are at most this far apart (nats); synthetic weights are nearly flat")
    ap.add_argument("--sweep", default="1-64", help="grid: prompt lengths of the crash sweep")
    ap.add_argument("--streams", type=int, default=64, help="grid: concurrent streams (0: none)")
    ap.add_argument("--inprocess-devices", default="2", help="inprocess: device counts")
    ap.add_argument("--ub", default="1-16", help="ubsweep: -ub values, in this order (a server start each)")
    ap.add_argument("--ub-devices", default="8", help="ubsweep: device counts")
    ap.add_argument("--ub-sweep", default="1-64", help="ubsweep: prompt lengths at each -ub")
    ap.add_argument("--ub-streams", type=int, default=8, help="ubsweep: concurrent streams at each -ub (0: none)")
    ap.add_argument("--force", action="store_true", help="run the grid even when the RPC check failed")
    a = ap.parse_args()
    try:
        a.models = lab_models.check(a.models.split(","))
        for name in ("devices", "inprocess_devices", "ub", "ub_devices"):
            setattr(a, name, md.parse_range(getattr(a, name), "--" + name.replace("_", "-")))
        md.parse_range(a.sweep, "--sweep"), md.parse_range(a.ub_sweep, "--ub-sweep")
        served.columns(a.columns, a.dispatch)
    except (ValueError, dsp.DispatchError) as e:
        ap.error(str(e))
    served.prepare(a)
    global D
    D = dsp.from_args(a, build_dir=a.work)
    a.command = shlex.join(stages.command("lab.runs.gpu_multidevice", sys.argv[1:]))
    os.makedirs(os.path.join(a.work, "md", "logs"), exist_ok=True)
    return stages.run(stages.expand(a.stages, EVERY), STAGES, a, a.work, os.path.join(a.work, "md"), {"command": a.command})


if __name__ == "__main__":
    sys.exit(main())
