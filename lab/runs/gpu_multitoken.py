"""Issue 42: multi-token cost curves on the real DeepSeek-V4 shape, pin vs patched, native and A100 dispatch in one run.

    python -m lab.runs.gpu_multitoken --work /tmp/dec [--columns pin,patched,pin@a100,patched@a100] STAGE...
        (all = models warmup verify batched draft ncu; report always runs last)

after lab.runs.gpu_build pin / patched (or gpu_decode build) and gpu_decode models (WORK/v4-43l.gguf, v4-4l.gguf):
models   the synthetic drafts of the draft target (--draft-target, default the 4-layer file): deepseek-v4-flash-dspark
         and -mtp, 16 experts, seed 42; --write NAME,..: also those of MODELS that are missing (seed 42; v4-4l-256 keeps
         all 256 experts, glm5-78l and glm5-12l are glm-5 --experts 16 at 78 and 12 layers), WORK/NAME.gguf
warmup   every column once on the 4-layer file (llama-bench k = 1..16, llama-batched-bench at every N): the PTX JIT and
         each dispatch's kernels are compiled before anything is timed
verify   llama-bench -p 1,..,16 -n DECODE -d DEPTH per --models file and column: one forward of k tokens at the same
         depth; k = 1 is the tg decode step. Columns in order then reversed (--rounds pairs). Runs of other files already
         in WORK/mt/verify.json stay (a file can be measured, deleted for disk, and the next one measured), and each
         file's weights per token (roofline) are recorded for the weights-read floor
batched  llama-batched-bench -npl N.. on --batched-model (43 layers): aggregate decode tok/s of N sequences
draft    llama-server on --draft-target per column: plain, then with each --drafts (--spec-draft-n-max --draft-n,
         --spec-draft-p-min 0): ms per step; the draft's own cost = that minus the plain step minus the extra verify
         cost of the drafted tokens (verify stage, same file and column)
probe    llama-server on --draft-target per column and --probe variant (NAME=SERVER ARGS;..., {dspark} and {mtp} name
         the draft files): ms per step, drafted per step, the speculative statistics line when the log has it
         (-lv 4); where the draft cost goes, by switching one thing at a time (WORK/mt/probe.json)
ncu      ncu --graph-profiling node on --ncu-model: the kernels of one forward of k = --ncu-ks tokens at --ncu-depth
         (llama-bench -p k -d DEPTH -r 1 --no-warmup minus the depth prefill alone), by kernel family, per --ncu-columns
report   WORK/mt/*.json -> $OUT/gpu-multitoken.json: rows {model, layers, dispatch, verify, batched, draft, projection}
         (lab/bench/multitoken.py), the commands, each column's dispatch and reported compute capability
Columns: BUILD[@DISPATCH] (lab/bench/dispatch.py); --dispatch is the default of columns without @. Each stage writes
WORK/mt/STAGE.json. Commit $OUT/gpu-multitoken.json as lab/results/gpu-multitoken.json, then python -m lab.benchmarks.report.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from lab.bench import dispatch as dsp
from lab.bench import multitoken as mt
from lab.bench import stages
from pyllm_a100.home import write_json_atomic

D = dsp.Dispatcher()  # main() replaces it from --dispatch / --dispatch-shim
# file -> (preset, layers, routed experts kept): 16 of 256 keeps every layer and the per-token work in a file that fits
MODELS = {"v4-43l": ("deepseek-v4-flash", 43, 16), "v4-4l": ("deepseek-v4-flash", 4, 16),
          "v4-4l-256": ("deepseek-v4-flash", 4, 256), "glm5-78l": ("glm-5", 78, 16),
          "glm5-12l": ("glm-5", 12, 16)}  # GLM-5's 3 dense layers and 9 MoE ones: every per-layer kernel, small for ncu
SERVER = ["-ngl", "99", "-fa", "on", "--fit", "off", "-np", "1", "-c", "4096", "-ub", "512"]


ALIASES: dict[str, tuple[str, dict[str, str]]] = {}  # --alias: label -> (build, environment entries)


def parse_alias(text: str) -> tuple[str, str, dict[str, str]]:
    """'nographs=patched,GGML_CUDA_DISABLE_GRAPHS=1' -> ('nographs', 'patched', {'GGML_CUDA_DISABLE_GRAPHS': '1'})."""
    name, _, rest = text.partition("=")
    build, *entries = rest.split(",")
    env = dict(e.split("=", 1) for e in entries if "=" in e)
    if not name or not build or "=" in build or len(env) != len(entries) or not env or "@" in name:
        raise ValueError(f"--alias {text!r}: write NAME=BUILD,VAR=VALUE[,VAR=VALUE] (nographs=patched,GGML_CUDA_DISABLE_GRAPHS=1)")
    return name, build, env


def resolve(label: str) -> tuple[str, dict[str, str]]:
    """A column's build and the environment entries it adds (an --alias's; none for a build's own label)."""
    return ALIASES.get(label, (label, {}))


def bindir(w: str, label: str) -> str:
    return os.path.join(w, f"{resolve(label)[0]}-bin")


def model_path(w: str, name: str) -> str:
    return os.path.join(w, f"{name}.gguf")


def run_env(w: str, label: str, extra: dict | None = None) -> dict:
    return dict(os.environ, CUDA_CACHE_MAXSIZE="4294967296", LD_LIBRARY_PATH=bindir(w, label),
                **resolve(label)[1], **(extra or {}))


def columns(a: argparse.Namespace, text: str | None = None) -> list[tuple[str, str, str]]:
    """[(name, build, dispatch)]: pin, patched, pin@a100, patched@a100 ..."""
    return dsp.expand_columns((text or a.columns).split(","), a.dispatch)


def seen(res: dict, name: str, disp: str, text: str, ask: tuple[str, dict] | None = None) -> None:
    """The column's dispatch record from a program's output, kept once it names a capability. ask: (bin_dir, env) of
    a llama-server, whose log has no device line: the build's --list-devices answers then (dispatch.server_record)."""
    if not (res.setdefault("dispatch", {}).get(name) or {}).get("reported_capability"):
        res["dispatch"][name] = dsp.server_record(disp, text, *ask) if ask else dsp.record(disp, text)


def program(w: str, build: str, disp: str, exe: str, args: list[str], res: dict, name: str, timeout: float = 900) -> str:
    """Run one llama.cpp program of a build under a dispatch; its stdout (stderr goes to the dispatch record)."""
    cmd = [os.path.join(bindir(w, build), exe), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                       env=run_env(w, build, D.env(disp)))
    seen(res, name, disp, p.stderr + p.stdout)
    res.setdefault("commands", {}).setdefault(name, [])
    if shlex.join(cmd) not in res["commands"][name]:
        res["commands"][name].append(shlex.join(cmd))
    if p.returncode:
        raise RuntimeError(f"{exe} ({name}) rc={p.returncode}: {p.stderr[-1200:]}")
    return p.stdout


def stage_models(a, w, res):
    from pyllm_a100.synth import synthesize

    target = MODELS[a.draft_target]
    layers = target[1]
    for draft in filter(None, a.drafts.split(",")):  # --drafts '': none (a run that measures no draft)
        out = os.path.join(w, f"{a.draft_target}-{draft}.gguf")
        if not os.path.exists(out + ".done"):
            t0 = time.time()
            synthesize(mt.DRAFTS[draft]["preset"], out, layers=layers, experts=16, seed=42)
            open(out + ".done", "w").write(str(time.time() - t0))
        res[draft] = {"path": out, "bytes": os.path.getsize(out)}
    for name in filter(None, a.write.split(",")):
        preset, layers, experts = MODELS[name]
        if not os.path.exists(model_path(w, name) + ".done"):
            t0 = time.time()
            synthesize(preset, model_path(w, name), layers=layers, experts=experts, seed=42)
            open(model_path(w, name) + ".done", "w").write(str(time.time() - t0))
            res[name] = {"seconds": round(time.time() - t0, 1), "bytes": os.path.getsize(model_path(w, name))}


def sass90(w, build):  # lab.runs.gpu_build --sass90 made the build's machine code: no PTX JIT at first use
    f = os.path.join(w, "results", f"build-{resolve(build)[0]}.json")
    return os.path.exists(f) and str(json.load(open(f)).get("sass90", "")).startswith("compute_80 PTX compiled")


def stage_warmup(a, w, res):
    small, npl = model_path(w, "v4-4l"), ",".join(map(str, mt.parse_npl(a.npl)))
    res["seconds"] = {}
    builds = {b for _, b, _ in columns(a) + columns(a, a.ncu_columns)}
    if all(sass90(w, b) for b in builds) and not a.force_warmup:
        res["skipped"] = f"builds {', '.join(sorted(builds))} carry sm_90 SASS (gpu-build --sass90): nothing to JIT"
        return
    for name, build, disp in columns(a) + columns(a, a.ncu_columns):
        if name in res["seconds"]:
            continue
        t0 = time.time()
        program(w, build, disp, "llama-bench", ["-m", small] + mt.verify_args(a.ks, 0, 1, 4), res, name)
        if os.path.exists(os.path.join(bindir(w, build), "llama-batched-bench")):
            program(w, build, disp, "llama-batched-bench", ["-m", small, "-npl", npl] + mt.batched_args(8, 2, max(mt.parse_npl(a.npl))),
                    res, name)
        res["seconds"][name] = round(time.time() - t0, 1)


def interleaved(a, cols):
    return [c for _ in range(a.rounds) for c in cols + cols[::-1]]


def model_weights(path):
    """roofline.WeightsPerToken's fields of one file, from its header read with the gguf package (the GPU machine's
    checkout has no llama.cpp library for pyllm's own reader)."""
    import dataclasses
    import types

    import gguf

    from pyllm_a100.models.roofline import weights_per_token

    reader = gguf.GGUFReader(path)

    def value(key, default=None):
        field = reader.fields.get(key)
        return default if field is None else field.contents()

    arch = value("general.architecture")
    metadata = {k: value(k) for k in (f"{arch}.expert_count", f"{arch}.expert_used_count")}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    files = types.SimpleNamespace(architecture=arch, metadata=metadata, n_vocab=len(tokens.data) if tokens else 0,
                                  tensor_bytes={t.name: int(t.n_bytes) for t in reader.tensors})
    return dataclasses.asdict(weights_per_token(files))


def stage_verify(a, w, res):
    models = a.models.split(",")
    before = load(w, "verify")
    res.update(ks=a.ks, depth=a.depth, reps=a.reps, decode_tokens=a.decode_tokens,
               runs=[r for r in before.get("runs", []) if r.get("model") not in models],
               weights={m: x for m, x in (before.get("weights") or {}).items() if m not in models})
    for model in models:
        try:
            res["weights"][model] = model_weights(model_path(w, model))
        except Exception as e:  # the timing still runs; the row has no weights_read
            res["weights"][model] = {"error": f"{type(e).__name__}: {e}"[-400:]}
        for order, (name, build, disp) in enumerate(interleaved(a, columns(a))):
            try:
                out = program(w, build, disp, "llama-bench", ["-m", model_path(w, model)] +
                              mt.verify_args(a.ks, a.depth, a.reps, a.decode_tokens), res, name, timeout=1200)
                v = mt.verify_ms(json.loads(out[out.index("["):]), a.ks, a.decode_tokens)
                res["runs"].append({"model": model, "column": name, "order": order, **v})
            except Exception as e:  # one failed run is recorded; the others still run
                res["runs"].append({"model": model, "column": name, "order": order, "error": str(e)[-800:]})
            json.dump(res, open(os.path.join(w, "mt", "verify.json"), "w"), indent=1)


def stage_batched(a, w, res):
    npl = mt.parse_npl(a.npl)
    res.update(model=a.batched_model, npl=npl, npp=a.npp, ntg=a.ntg, runs=[])
    for order, (name, build, disp) in enumerate(interleaved(a, columns(a))):
        try:
            out = program(w, build, disp, "llama-batched-bench", ["-m", model_path(w, a.batched_model), "-npl",
                          ",".join(map(str, npl))] + mt.batched_args(a.npp, a.ntg, max(npl)), res, name, timeout=1800)
            lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
            res["runs"].append({"column": name, "order": order, "tps": {int(r["pl"]): r["speed_tg"] for r in lines},
                                "prefill_tps": {int(r["pl"]): r["speed_pp"] for r in lines}})
        except Exception as e:
            res["runs"].append({"column": name, "order": order, "error": str(e)[-800:]})
        json.dump(res, open(os.path.join(w, "mt", "batched.json"), "w"), indent=1)


def prompts_for(a, n_vocab):  # the same token ids for every server of a run (seeded), within the model's vocabulary
    rng = random.Random(0)
    low = min(300, n_vocab // 4)
    return [[rng.randrange(low, n_vocab) for _ in range(a.draft_prompt)] for _ in range(a.draft_requests)]


def served(a, w, build, disp, args, n, res, name, log, env=None, tokens=None):
    """Greedy completions of the run's prompts on one llama-server; their timings (after an uncounted warm-up).
    env: more environment for the server; tokens: a list that receives each completion's token ids."""
    import httpx

    from lab.gpucheck.build_server import BuildServer
    from pyllm_a100.bench.draft_exactness import greedy
    from pyllm_a100.bench.throughput import _vocab_size

    server = BuildServer(bindir(w, build), args, log_path=log,
                         extra_env=dict(D.env(disp), CUDA_CACHE_MAXSIZE="4294967296", **(env or {})))
    try:
        server.start()
        with httpx.Client() as client:
            prompts = prompts_for(a, _vocab_size(client, server.base_url))
        greedy(server.base_url, prompts[0][:8], 8)
        runs = [greedy(server.base_url, p, n) for p in prompts]
        if tokens is not None:
            tokens.extend(ids for ids, _ in runs)
        return [timings for _, timings in runs]
    finally:
        server.stop()
        seen(res, name, disp, open(log, errors="replace").read() if os.path.exists(log) else "",
             ask=(bindir(w, build), run_env(w, build, D.env(disp))))


def stage_draft(a, w, res):
    verify = json.load(open(os.path.join(w, "mt", "verify.json"))) if os.path.exists(os.path.join(w, "mt", "verify.json")) else {}
    target = model_path(w, a.draft_target)
    res.update(target=a.draft_target, draft_n=a.draft_n, requests=a.draft_requests, tokens=a.draft_tokens, columns={})
    logs = os.path.join(w, "mt", "draft-logs")
    os.makedirs(logs, exist_ok=True)
    for name, build, disp in columns(a):
        col = res["columns"][name] = {}
        v = mt.verify_ms_means([r for r in verify.get("runs", []) if r.get("model") == a.draft_target and r.get("column") == name])
        try:
            plain = mt.step_ms(served(a, w, build, disp, ["-m", target] + SERVER, a.draft_tokens, res, name,
                                      os.path.join(logs, f"{name}-plain.log")))
            col["plain"] = plain
            for draft in a.drafts.split(","):
                spec = ["--spec-draft-model", os.path.join(w, f"{a.draft_target}-{draft}.gguf"), "--spec-type",
                        mt.DRAFTS[draft]["spec_type"], "--spec-draft-n-max", str(a.draft_n), "--spec-draft-p-min", "0"]
                s = mt.step_ms(served(a, w, build, disp, ["-m", target] + SERVER + spec, a.draft_tokens, res, name,
                                      os.path.join(logs, f"{name}-{draft}.log")))
                s["own_ms"] = mt.draft_cost(plain["step_ms"], s["step_ms"], v, s["drafted_per_step"]) if v else None
                s["argv"] = shlex.join(spec)
                col[draft] = s
        except Exception as e:
            col["error"] = f"{type(e).__name__}: {e}"[-800:]
        json.dump(res, open(os.path.join(w, "mt", "draft.json"), "w"), indent=1)


def stage_probe(a, w, res):
    import hashlib
    import re

    target = model_path(w, a.draft_target)
    drafts = {d: os.path.join(w, f"{a.draft_target}-{d}.gguf") for d in mt.DRAFTS}
    variants = [v.split("=", 1) for v in a.probe.split(";") if v.strip()]
    res.update(target=a.draft_target, variants=dict(variants), columns={})
    logs = os.path.join(w, "mt", "probe-logs")
    os.makedirs(logs, exist_ok=True)
    for name, build, disp in columns(a):
        col = res["columns"][name] = {}
        for vname, vargs in variants:
            log = os.path.join(logs, f"{name}-{vname}.log")
            try:
                extra = shlex.split(vargs.format(**drafts))
                env = dict(x.split("=", 1) for x in extra if "=" in x and not x.startswith("-") and x[0].isupper())
                extra = [x for x in extra if x.split("=", 1)[0] not in env]  # KEY=VALUE words: the server's environment
                ids: list = []
                col[vname] = mt.step_ms(served(a, w, build, disp, ["-m", target] + SERVER + extra, a.draft_tokens, res,
                                               name, log, env=env, tokens=ids))
                col[vname]["tokens_sha1"] = hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:12]
                text = open(log, errors="replace").read()
                stats = re.findall(r"statistics\s+\S+: .*", text)
                if stats:
                    col[vname]["statistics"] = stats[-1][:600]
                # the server's own count of decode graphs reused, per request (cumulative): a step that rebuilds
                # its graph pays the build and, on a GPU, a kernel-by-kernel launch
                col[vname]["graphs_reused"] = [int(n) for n in re.findall(r"graphs reused =\s+(\d+)", text)]
                for key, pattern in (("timeline", r"pyllm-timeline: .*"),  # builds with lab/patches' probes
                                     ("cuda_counters", r"pyllm-cuda-counters: .*"),
                                     ("decode_phases", r"pyllm-decode-phases: .*")):
                    lines = re.findall(pattern, text)
                    if lines:
                        col[vname][key] = lines
            except Exception as e:
                col[vname] = {"error": f"{type(e).__name__}: {e}"[-800:]}
            json.dump(res, open(os.path.join(w, "mt", "probe.json"), "w"), indent=1)
    digests = {f"{c}:{v}": x.get("tokens_sha1") for c, vs in res["columns"].items() for v, x in vs.items()}
    res["tokens_equal"] = len({d for d in digests.values()}) == 1 and None not in digests.values()
    json.dump(res, open(os.path.join(w, "mt", "probe.json"), "w"), indent=1)
    for c, vs in res["columns"].items():
        for v, x in vs.items():
            print(f"probe {c:>16} {v:>14}: " + (x["error"][-200:] if "error" in x else
                  f"{x['step_ms']:.3f} ms a step, {x['drafted_per_step']:.2f} drafted, {x['accepted'] / x['steps']:.2f} "
                  f"accepted, {x['tokens_per_s']:.1f} tok/s, graphs reused {x.get('graphs_reused')}, "
                  f"tokens {x['tokens_sha1']}"))
    print(f"probe: greedy tokens equal in every variant and column: {res['tokens_equal']}")


def stage_ncu(a, w, res):
    from pyllm_a100.bench.profile import kernel_family, ncu_kernel_tables

    if not shutil.which("ncu"):
        raise RuntimeError("ncu (Nsight Compute) is not on PATH")
    model = model_path(w, a.ncu_model)
    res.update(model=a.ncu_model, ks=a.ncu_ks, depth=a.ncu_depth, cache_control=a.ncu_cache, columns={})
    common = ["-n", "0", "-r", "1", "--no-warmup", "-ngl", "99", "-fa", "1", "-b", "2048", "-ub", "512"]
    for name, build, disp in columns(a, a.ncu_columns):
        env, out = run_env(w, build, D.env(disp)), res["columns"].setdefault(name, {})

        def table(tag, args):
            rep = os.path.join(w, "mt", f"ncu-{name}-{tag}.csv")
            tool = [os.path.join(bindir(w, build), "llama-bench"), "-m", model, *args, *common]
            try:
                return ncu_kernel_tables(tool, rep, env=env, cache_control=a.ncu_cache)["name"]
            finally:
                if os.path.exists(rep + ".stdout"):
                    seen(res, name, disp, open(rep + ".stdout", errors="replace").read())

        try:
            base = table("depth", ["-p", str(a.ncu_depth), "-d", "0"]) if a.ncu_depth else {}
            for k in a.ncu_ks:
                second = table(f"k{k}", ["-p", str(k), "-d", str(a.ncu_depth)])
                fams: dict[str, list] = {}
                for kname, (c, us) in second.items():
                    c0, us0 = base.get(kname, (0, 0.0))
                    if c - c0 > 0:
                        f = fams.setdefault(kernel_family(kname), [0, 0.0])
                        f[0], f[1] = f[0] + c - c0, f[1] + us - us0
                rows = sorted(({"family": f, "count": c, "us": round(us, 1)} for f, (c, us) in fams.items()), key=lambda r: -r["us"])
                out[f"k={k}"] = {"kernels": sum(r["count"] for r in rows), "us": round(sum(r["us"] for r in rows), 1), "families": rows}
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"[-800:]
        json.dump(res, open(os.path.join(w, "mt", "ncu.json"), "w"), indent=1)


def load(w, stage):
    f = os.path.join(w, "mt", f"{stage}.json")
    return json.load(open(f)) if os.path.exists(f) else {}


def stage_report(a, w, res):
    st = {s: load(w, s) for s in ("warmup", "verify", "batched", "draft", "ncu", "models")}
    verify: dict = {}
    for r in st["verify"].get("runs", []):
        if "k_ms" in r:
            verify.setdefault(r["model"], {}).setdefault(r["column"], []).append(r)
    verify = {m: {c: mt.verify_ms_means(rs) for c, rs in cols.items()} for m, cols in verify.items()}
    roles = mt.parse_roles(a.report_as)  # --report-as pin=patched,patched=cand: the table's two builds from other columns
    batched: dict = {}
    for r in st["batched"].get("runs", []):
        for n, tps in (r.get("tps") or {}).items():
            batched.setdefault(st["batched"]["model"], {}).setdefault(r["column"], {}).setdefault(int(n), []).append(tps)
    batched = {m: {c: {n: mt.mean(v) for n, v in ns.items()} for c, ns in cols.items()} for m, cols in batched.items()}
    verify, batched = ({m: mt.as_roles(cols, roles) for m, cols in src.items()} for src in (verify, batched))
    drafts = {d: {c: {"own_ms": (v.get(d) or {}).get("own_ms"), "drafted": (v.get(d) or {}).get("drafted_per_step")}
                  for c, v in (st["draft"].get("columns") or {}).items()} for d in a.drafts.split(",")}
    models = {m: MODELS[m] for m in sorted(set(verify) | set(batched), key=lambda m: (-MODELS[m][1], MODELS[m][2]))}
    weights = {m: x for m, x in (st["verify"].get("weights") or {}).items() if "error" not in x}
    dispatch = {c: d for s in st.values() if isinstance(s.get("dispatch"), dict) for c, d in s["dispatch"].items()}
    gpu = a.gpu or (subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True).stdout.strip()
                    if shutil.which("nvidia-smi") else "no nvidia-smi (CPU machine)")
    result = {
        "generated_by": "python -m lab.runs.gpu_multitoken", "gpu": gpu, "started": st["verify"].get("started"),
        "settings": {k: getattr(a, k) for k in ("columns", "models", "ks", "depth", "reps", "decode_tokens", "rounds", "npl",
                                                "npp", "ntg", "batched_model", "drafts", "draft_target", "draft_n",
                                                "projection_draft", "accept_lens", "k_ref")},
        "projection_rule": mt.PROJECTION_RULE.replace(f"E(a, {mt.K_REF})", f"E(a, {a.k_ref})"),
        "rows": mt.rows(models, verify, batched, drafts, projection_draft=a.projection_draft, accept_lens=a.accept_lens,
                        k_ref=a.k_ref, weights=weights, labels=mt.parse_roles(a.labels)),
        "drafts": st["draft"].get("columns"), "kernels": st["ncu"].get("columns"),
        "dispatch": dispatch, "reported_capability": {c: d.get("reported_capability") for c, d in dispatch.items()},
        "commands": {"stages": {s: v.get("command") for s, v in st.items() if v}, "programs": {s: v.get("commands") for s, v in st.items() if v}},
        "errors": {s: v.get("error") for s, v in st.items() if v.get("error")},
    }
    out = os.environ.get("OUT") or w
    os.makedirs(out, exist_ok=True)
    json.dump(result, open(os.path.join(out, "gpu-multitoken.json"), "w"), indent=1)
    if a.shapes_into:  # this run's rows replace those of the same files there; the others stay
        shapes = json.load(open(a.shapes_into)) if os.path.exists(a.shapes_into) else None
        write_json_atomic(Path(a.shapes_into), mt.merge_shapes(shapes, result))
        print(f"rows merged into {a.shapes_into}")
    print(mt.render(result) if any(r["layers"] == 43 for r in result["rows"]) else mt.render_shapes(result))


STAGES = {"models": stage_models, "warmup": stage_warmup, "verify": stage_verify, "batched": stage_batched,
          "draft": stage_draft, "probe": stage_probe, "ncu": stage_ncu, "report": stage_report}


def main() -> int:
    from pyllm_a100.bench.draft_costs import parse_k_range

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", choices=[*STAGES, "all"])
    ap.add_argument("--work", default="/tmp/dec")
    ap.add_argument("--columns", default="pin,patched,pin@a100,patched@a100", help="BUILD[@DISPATCH] columns, interleaved")
    ap.add_argument("--models", default="v4-43l,v4-4l", help=f"verify: files of {', '.join(MODELS)} (WORK/NAME.gguf)")
    ap.add_argument("--k", dest="k_text", default="1-16", help="verify: tokens per forward, 1-16 or 1,2,4,8")
    ap.add_argument("--depth", type=int, default=512, help="verify: tokens already in the context")
    ap.add_argument("--reps", type=int, default=5, help="verify: llama-bench -r (5: the median is a replay of the k "
                    "forward's CUDA graph; with 3 it can be a forward before its graph, GLM-5 k = 2 1.55x against 1.17x)")
    ap.add_argument("--decode-tokens", type=int, default=16, help="verify: the tg test's tokens (k = 1)")
    ap.add_argument("--rounds", type=int, default=1, help="round pairs: the columns in order, then reversed")
    ap.add_argument("--npl", default="1,2,3,4,6,8,12,16,24,32", help="batched: sequence counts (1-32 for every N)")
    ap.add_argument("--npp", type=int, default=64, help="batched: prompt tokens per sequence")
    ap.add_argument("--ntg", type=int, default=16, help="batched: decode steps")
    ap.add_argument("--batched-model", default="v4-43l")
    ap.add_argument("--drafts", default="dspark,mtp")
    ap.add_argument("--draft-target", default="v4-4l", help="draft: the target served with the drafts (a draft's own "
                    "cost does not depend on the target's depth; the 4-layer file loads in seconds)")
    ap.add_argument("--draft-n", type=int, default=7, help="draft: --spec-draft-n-max (DSpark's block of 8: 7)")
    ap.add_argument("--draft-requests", type=int, default=2)
    ap.add_argument("--draft-tokens", type=int, default=64)
    ap.add_argument("--draft-prompt", type=int, default=64)
    ap.add_argument("--projection-draft", default="dspark", choices=list(mt.DRAFTS))
    ap.add_argument("--accept-lens", default="2.5,2.9")
    ap.add_argument("--k-ref", type=int, default=mt.K_REF, help="drafted tokens at which the accept lengths hold")
    ap.add_argument("--probe", default="plain=;dspark=--spec-draft-model {dspark} --spec-type draft-dspark "
                    "--spec-draft-n-max 7 --spec-draft-p-min 0",
                    help="probe: NAME=SERVER ARGS;.. ({dspark}/{mtp}: the draft files)")
    ap.add_argument("--ncu-columns", default="pin@a100,patched@a100")
    ap.add_argument("--ncu-ks", default="1,7,8,16")
    ap.add_argument("--ncu-depth", type=int, default=512, help="ncu: context depth (0: none, no baseline run)")
    ap.add_argument("--ncu-model", default="v4-4l")
    ap.add_argument("--ncu-cache", default="none", choices=["all", "none"])
    ap.add_argument("--force-warmup", action="store_true", help="warmup: run even when every build is --sass90")
    ap.add_argument("--report-as", default="", help="report: ROLE=BUILD,.. the table's pin and patched rows from other "
                    "builds' columns (pin=patched,patched=cand: a candidate against the series)")
    ap.add_argument("--labels", default="", help="report: ROLE=TEXT,.. what the build column says for pin/patched "
                    "(patched=0001-0038)")
    ap.add_argument("--gpu", default="", help="report: the GPU the stages ran on, when the report runs elsewhere "
                    "(default: nvidia-smi's name and driver here)")
    ap.add_argument("--shapes-into", default="", help="report: merge the rows into this shapes file "
                    "(lab/results/gpu-multitoken-shapes.json)")
    ap.add_argument("--alias", action="append", default=[], help="NAME=BUILD,VAR=VALUE: a column label that runs "
                    "BUILD's programs with VAR=VALUE in their environment (nographs=patched,GGML_CUDA_DISABLE_GRAPHS=1)")
    ap.add_argument("--write", default="", help=f"models: also write these files if missing ({', '.join(MODELS)})")
    dsp.add_arguments(ap)
    a = ap.parse_args()
    global D
    D = dsp.from_args(a, build_dir=a.work)
    try:
        a.ks = parse_k_range(a.k_text)
        a.ncu_ks = [int(k) for k in a.ncu_ks.split(",")]
        a.accept_lens = [float(x) for x in a.accept_lens.split(",")]
        mt.parse_npl(a.npl)
        mt.parse_roles(a.report_as), mt.parse_roles(a.labels)
        columns(a), columns(a, a.ncu_columns)
        for text in a.alias:
            name, build, env = parse_alias(text)
            if name in ALIASES or name == build:
                raise ValueError(f"--alias {text!r}: {name} is already a column's name; give each alias a new one")
            ALIASES[name] = (build, env)
        for x in a.accept_lens:
            mt.acceptance(x, a.k_ref)
    except Exception as e:
        ap.error(str(e))
    bad = [m for m in a.models.split(",") + [a.batched_model, a.draft_target, a.ncu_model] + list(filter(None, a.write.split(",")))
           if m not in MODELS]
    if bad or set(filter(None, a.drafts.split(","))) - set(mt.DRAFTS) or a.rounds < 1 or a.reps < 1:
        ap.error(f"models {bad or 'ok'} (choose from {', '.join(MODELS)}), --drafts from {', '.join(mt.DRAFTS)}, "
                 "--rounds and --reps >= 1")
    if a.shapes_into and (os.path.isdir(a.shapes_into) or not os.path.isdir(os.path.dirname(os.path.abspath(a.shapes_into)))):
        ap.error(f"--shapes-into {a.shapes_into}: give a JSON file path in an existing folder (lab/results/gpu-multitoken-shapes.json)")
    if 1 not in a.ks:
        ap.error("--k must include 1 (the decode step every ratio is taken against)")
    w = a.work
    os.makedirs(os.path.join(w, "mt"), exist_ok=True)
    return stages.run(stages.expand(a.stages, ["models", "warmup", "verify", "batched", "draft", "ncu"]), STAGES, a, w,
                      os.path.join(w, "mt"), {"command": shlex.join(stages.command("lab.runs.gpu_multitoken", sys.argv[1:]))},
                      idle=lambda st: {} if st != "models" else "none: no llama.cpp process in this stage")

if __name__ == "__main__":
    sys.exit(main())
