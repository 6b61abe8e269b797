"""Issue 41: re-verify pin and patched under the A100 dispatch (lab/scripts/a100-dispatch.c) on a newer GPU.

    python -m lab.runs.gpu_a100_check --work /tmp/dec [--dispatch a100] [--dispatch-shim PATH] STAGE...
        (all = ops soak tokens sanitizer)

after python -m lab.runs.gpu_build pin and patched (or gpu_decode build) and gpu-decode models (WORK/v4-4l.gguf):
ops        test-backend-ops for EVERY test, each build of --builds (default pin,patched; columns BUILD[@DISPATCH], the
           default dispatch --dispatch, a100 unless told): `support` lists the cases, then one `test -o '^X'` process
           per first letter X of the test names (the fusion tests support mode does not list are in them too) and
           FLASH_ATTN_EXT in parts by head size (-p '^hsk=N,'), --parallel at a time, --op-timeout / --part-timeout
           each; per test name and part: cases, passed, failed, not supported, not run (lab/bench/a100check.py).
           --ops A,B: only those (exact names)
soak       the crash sweep through the patched llama-server (--soak-build): prompt lengths 1..--max-length on
           tiny-deepseek4, tiny-glm-dsa, tiny-deepseek32, tiny-llama, tiny-mamba and the 4-layer V4, all ud-q8-k-xl
           (lab/bench/soak.py, 1/4/16 concurrent too), then -ub 1..16 on the 4-layer V4 (lengths 1..40)
tokens     lab.runs.gpu_token_check WORK pin patched pin@a100 patched@a100: greedy tokens and top-4 log-probabilities,
           patched against the pin of its dispatch, each @a100 run against its native twin
sanitizer  compute-sanitizer memcheck (llama-completion -n 8) and racecheck (-n 2, --racecheck-timeout) on the 4-layer
           V4 and the tiny V4, patched build, default dispatch
report     WORK/a100/*.json -> $OUT/gpu-a100-dispatch.json (+ .txt): each part with its dispatch, the compute
           capability llama.cpp logged, and the command that reproduces it
Each stage writes WORK/a100/STAGE.json (its failure too). Commit $OUT/gpu-a100-dispatch.json as lab/results/.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from lab.bench import a100check as ac
from lab.bench import dispatch as dsp
from lab.bench.native_view import native_view
from lab.bench import stages

D = dsp.Dispatcher("a100")  # main() replaces it from --dispatch / --dispatch-shim
PROMPT = "The capital of France is"


def bindir(w: str, label: str) -> str:
    return os.path.join(w, f"{label}-bin")


def run_env(w: str, label: str, extra: dict | None = None) -> dict:
    return dict(os.environ, CUDA_CACHE_MAXSIZE="4294967296", LD_LIBRARY_PATH=bindir(w, label), **(extra or {}))


def run_group(cmd: list[str], timeout: float, env: dict) -> tuple[str, str, int | str]:
    """(stdout, stderr, exit code or "timeout"): the program in its own process group, all of it killed at the timeout
    (compute-sanitizer runs the program as its child: killing the sanitizer alone would leave it on the GPU). stderr
    apart: test-backend-ops writes its errors there, in the middle of a case line."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return out, err, p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return out, err, "timeout"


def ub_sweep(a: argparse.Namespace) -> list[int]:
    """The soak's -ub values: --ub-values (distinct, >= 1) when given, else 1..--ub."""
    if not a.ub_values:
        return list(range(1, a.ub + 1))
    parts = [x.strip() for x in a.ub_values.split(",")]
    if not all(x.isdigit() and int(x) >= 1 for x in parts) or len(set(parts)) != len(parts):
        raise ValueError(f"--ub-values {a.ub_values!r}: give distinct -ub values >= 1 separated by commas, e.g. 43,64,128")
    return [int(x) for x in parts]


def rerun(a: argparse.Namespace, stage: str) -> str:
    """The command that reproduces a stage (the options that matter to it)."""
    opts = ["--work", a.work, "--dispatch", a.dispatch] + (["--dispatch-shim", a.dispatch_shim] if a.dispatch_shim else [])
    opts += {"ops": ["--builds", a.builds, "--parallel", str(a.parallel), "--op-timeout", str(a.op_timeout), "--part-timeout",
                     str(a.part_timeout)] + (["--ops", a.ops] if a.ops else []),
             "soak": ["--soak-build", a.soak_build, "--soak-models", a.soak_models, "--max-length", str(a.max_length),
                      "--ub", str(a.ub), "--ub-lengths", str(a.ub_lengths)] + (["--ub-values", a.ub_values] if a.ub_values else []),
             "tokens": ["--token-specs", a.token_specs],
             "sanitizer": ["--sanitizer-build", a.sanitizer_build, "--tools", a.tools]}.get(stage, [])
    return shlex.join(stages.command("lab.runs.gpu_a100_check", [*opts, stage]))


def stage_ops(a: argparse.Namespace, w: str, res: dict) -> None:
    res["builds"], res["command"] = {}, rerun(a, "ops")
    logs = os.path.join(w, "a100", "ops-logs")
    os.makedirs(logs, exist_ok=True)
    builds = {}  # name -> what the pool needs, and the support listing's record
    for spec in a.builds.split(","):
        base, disp = D.split(spec)
        name, exe = dsp.column_name(base, disp), os.path.join(bindir(w, base), "test-backend-ops")
        env = run_env(w, base, D.env(disp))
        listing = [exe, "support", "-b", a.backend]
        p = subprocess.run(listing, capture_output=True, text=True, errors="replace", timeout=900, env=env)
        open(os.path.join(logs, f"{name}-support.log"), "w").write(p.stdout + p.stderr)
        cases = ac.support_cases(p.stdout)
        if not cases:
            raise RuntimeError(f"{name}: test-backend-ops support listed no case (rc {p.returncode}; {logs}/{name}-support.log)")
        builds[name] = dict(exe=exe, env=env, disp=disp, listing=listing, cases=cases, log=p.stdout + p.stderr,
                            jobs=ac.jobs(cases, ac.fa_parts() if a.fa_parts else {}, only=a.ops.split(",") if a.ops else None))

    def run(item: tuple[str, dict]) -> list[dict]:
        name, job = item
        b, fa = builds[name], job["op"] == ac.FA
        cmd = [b["exe"], "test", "-b", a.backend, "-o", job["filter"]] + (["-p", job["params"]] if job["params"] else []) + \
            (["-j", str(a.part_workers)] if fa and a.part_workers > 1 else [])  # a name group: one worker, whole lines
        started = time.time()
        out, err, rc = run_group(cmd, a.part_timeout if fa else a.op_timeout, b["env"])
        tag = re.sub(r"[^A-Za-z0-9_=.-]+", "_", f"{job['op'] or 'names'}-{job['part'] or 'all'}")[:100]
        open(os.path.join(logs, f"{name}-{tag}.log"), "w").write(f"$ {shlex.join(cmd)}\n{out}\n--- stderr\n{err}")
        found = [ac.count(out + err, rc, job)] if fa else ac.split_names(out, rc, job)
        extra = dict(process_seconds=round(time.time() - started, 1), command=shlex.join(cmd), build=name,
                     reported_capability=dsp.reported_capability(out + err))
        return [dict(r, **extra) for r in found]

    # both builds' processes in one pool, the biggest first: no core waits on one build's tail
    work = sorted(((n, j) for n, b in builds.items() for j in b["jobs"]), key=lambda item: -item[1]["supported"])
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=a.parallel) as pool:
        rows = [r for found in pool.map(run, work) for r in found]
    for name, b in builds.items():
        mine = [r for r in rows if r["build"] == name]
        rec = dsp.record(b["disp"], b["log"])
        res["builds"][name] = {"dispatch": b["disp"], "reported_capability": rec["reported_capability"], "record": rec,
                               "capabilities_in_runs": sorted({r["reported_capability"] for r in mine if r["reported_capability"]}),
                               "support_command": shlex.join(b["listing"]), "listed_ops": len(b["cases"]),
                               "jobs": len(b["jobs"]), "seconds": round(time.time() - t0, 1),
                               "process_seconds": round(sum({r["command"]: r["process_seconds"] for r in mine}.values()), 1),
                               "totals": ac.totals(mine), "ops": ac.by_op(mine)}
    json.dump(res, open(os.path.join(w, "a100", "ops.json"), "w"), indent=1)
    bad = sorted({op for b in res["builds"].values() for op in b["totals"]["failing_ops"]})
    cut = sorted({u for b in res["builds"].values() for u in b["totals"]["unfinished"]})
    if bad or cut:  # recorded above; the stage says so (exit 1)
        def some(xs):
            return ", ".join(xs[:12]) + (f" and {len(xs) - 12} more" if len(xs) > 12 else "")
        raise RuntimeError("; ".join(filter(None, [bad and f"failing {some(bad)}", cut and f"unfinished {some(cut)}"])))


def soak_models(a: argparse.Namespace, w: str) -> list[tuple[str, str]]:
    from pyllm_a100.synth import synthesize

    out = []
    for preset in a.soak_models.split(","):
        if preset == "deepseek-v4-flash-4l":
            path = os.path.join(w, "v4-4l.gguf")  # gpu-decode models: 4 layers, 16 experts, ud-q8-k-xl, seed 42
            if not os.path.exists(path):
                synthesize("deepseek-v4-flash", path, layers=4, experts=16, weight_type="ud-q8-k-xl", seed=42)
        else:
            path = os.path.join(w, "soak-models", f"{preset}-{a.soak_type}.gguf")
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                synthesize(preset, path, weight_type=a.soak_type, seed=42)
        out.append((preset, path))
    return out


def stage_soak(a: argparse.Namespace, w: str, res: dict) -> None:
    base, disp = D.split(a.soak_build)
    os.environ["PYLLM_NATIVE_DIR"] = native_view(w, base)  # the package's Server now starts this build's llama-server
    from lab.bench.soak import soak

    logs = os.path.join(w, "a100", "soak-logs")
    os.makedirs(logs, exist_ok=True)
    env = run_env(w, base, D.env(disp))
    res.update(build=dsp.column_name(base, disp), command=rerun(a, "soak"), cases=[])

    def case(label: str, model: str, **kw) -> None:
        log = os.path.join(logs, label.replace(" ", "_") + ".log")
        print(f"   soak {label}", flush=True)
        try:
            r = soak(model, n_gpu_layers=999, log_path=log, env=env, **kw)
        except Exception as exc:  # a server that never starts is a failed case, not a lost stage
            r = {"error": f"{type(exc).__name__}: {exc}"[:600], "crashes": 0, "http_errors": 0, "requests": 0}
        rec = dsp.record(disp, open(log, errors="replace").read() if os.path.exists(log) else "")
        res["cases"].append({"label": label, **{k: v for k, v in r.items() if k != "server_options"},
                             "dispatch": disp, "reported_capability": rec["reported_capability"]})
        res["verdict"] = ac.soak_verdict(res["cases"])
        json.dump(res, open(os.path.join(w, "a100", "soak.json"), "w"), indent=1)

    models = soak_models(a, w)
    for preset, path in models:
        case(f"{preset} lengths 1-{a.max_length}", path, lengths=range(1, a.max_length + 1), concurrency=(1, 4, 16), parallel=16)
    v4 = dict(models).get("deepseek-v4-flash-4l")
    if v4 and (a.ub or a.ub_values):
        for ub in ub_sweep(a):
            case(f"deepseek-v4-flash-4l -ub {ub}", v4, lengths=range(1, a.ub_lengths + 1), concurrency=(4,), parallel=4,
                 extra_args=["-ub", str(ub)])
    res["reported_capability"] = sorted({c["reported_capability"] for c in res["cases"] if c["reported_capability"]})
    v = res["verdict"]
    if v["crashes"] or v["http_errors"] or v["failed_cases"]:
        raise RuntimeError(f"crash sweep: {v['crashes']} crash(es), {v['http_errors']} HTTP error(s) in {v['failed_cases']}")


def stage_tokens(a: argparse.Namespace, w: str, res: dict) -> None:
    out = os.path.join(w, "a100")
    cmd = [sys.executable, "-m", "lab.runs.gpu_token_check", w, *a.token_specs.split(","), "--dispatch", "native"]
    if any(D.split(s)[1] == "a100" for s in a.token_specs.split(",")):
        cmd += ["--dispatch-shim", str(D.shim)]
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=dict(os.environ, OUT=out), timeout=1800)
    open(os.path.join(out, "tokens.log"), "w").write(p.stdout + p.stderr)
    data = json.load(open(os.path.join(out, "token-check.json")))
    res.update(command=rerun(a, "tokens"), script=shlex.join(cmd), rc=p.returncode, summary=data.get("summary"),
               all_equal=data.get("all_equal"), dispatch=data.get("dispatch"),
               reported_capability=data.get("reported_capability"))


def stage_sanitizer(a: argparse.Namespace, w: str, res: dict) -> None:
    if not shutil.which("compute-sanitizer"):
        raise RuntimeError("compute-sanitizer is not on PATH (the CUDA toolkit's bin folder)")
    base, disp = D.split(a.sanitizer_build)
    exe, env = os.path.join(bindir(w, base), "llama-completion"), run_env(w, base, D.env(disp))
    tiny = os.path.join(w, "tiny-v4.gguf")
    if not os.path.exists(tiny):
        from pyllm_a100.synth import synthesize
        synthesize("tiny-deepseek4", tiny, seed=42)
    res.update(build=dsp.column_name(base, disp), command=rerun(a, "sanitizer"), runs={})
    plan = [("memcheck", "v4-4l", os.path.join(w, "v4-4l.gguf"), 8, a.memcheck_timeout),
            ("racecheck", "v4-4l", os.path.join(w, "v4-4l.gguf"), 2, a.racecheck_timeout),
            ("memcheck", "tiny-v4", tiny, 8, a.memcheck_timeout), ("racecheck", "tiny-v4", tiny, 2, a.racecheck_timeout)]
    old = os.path.join(w, "a100", "sanitizer.json")  # an earlier run of the other tool: keep its runs
    if os.path.exists(old):
        res["runs"].update(json.load(open(old)).get("runs") or {})
    for tool, label, model, n, timeout in [p for p in plan if p[0] in a.tools.split(",")]:
        cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", exe, "-m", model, "-ngl", "99", "-no-cnv",
               "-p", PROMPT, "-n", str(n), "--temp", "0", "--ignore-eos", "-c", "512", "--no-warmup", "-s", "42"]
        t0 = time.time()
        out, err, rc = run_group(cmd, timeout, env)
        out += err
        open(os.path.join(w, "a100", f"sanitizer-{tool}-{label}.log"), "w").write(f"$ {shlex.join(cmd)}\n{out}")
        res["runs"][f"{tool} {label} -n {n}"] = dict(ac.memcheck_summary(out), rc=rc, seconds=round(time.time() - t0, 1),
                                                     command=shlex.join(cmd), **dsp.record(disp, out))
        json.dump(res, open(os.path.join(w, "a100", "sanitizer.json"), "w"), indent=1)
    bad = [k for k, r in res["runs"].items() if r.get("errors") or (r.get("finished") and r["rc"] not in (0,))]
    if bad:
        raise RuntimeError(f"compute-sanitizer reported errors in {bad}")


def stage_report(a: argparse.Namespace, w: str, res: dict) -> None:
    parts = {os.path.basename(f)[:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(w, "a100", "*.json")))
             if os.path.basename(f) not in ("token-check.json",)}
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip() if shutil.which("nvidia-smi") else "no nvidia-smi"
    result = {"generated_by": "python -m lab.runs.gpu_a100_check", "gpu": gpu, "dispatch": a.dispatch,
              "shim": D.describe(), "parts": {k: {"ok": v.get("ok"), "error": v.get("error"), "seconds": v.get("seconds"),
                                                    "command": v.get("command")} for k, v in parts.items()},
              **{k: v for k, v in parts.items()}}
    result["reported_capability"] = {k: v.get("reported_capability") or {b: x.get("reported_capability") for b, x in
                                                                          (v.get("builds") or {}).items()} for k, v in parts.items()}
    text, out = ac.text_summary(result), os.environ.get("OUT") or w
    os.makedirs(out, exist_ok=True)
    json.dump(result, open(os.path.join(out, "gpu-a100-dispatch.json"), "w"), indent=1)
    open(os.path.join(out, "gpu-a100-dispatch.txt"), "w").write(text)
    print(text)


STAGES = {"ops": stage_ops, "soak": stage_soak, "tokens": stage_tokens, "sanitizer": stage_sanitizer, "report": stage_report}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", choices=[*STAGES, "all"])
    ap.add_argument("--work", default="/tmp/dec")
    ap.add_argument("--builds", default="pin,patched", help="ops: BUILD[@DISPATCH] columns (default pin,patched)")
    ap.add_argument("--ops", help="ops: only these ops (default: every op test-backend-ops lists)")
    ap.add_argument("--backend", default="CUDA0", help="ops: test-backend-ops -b (default CUDA0; CPU to try it on a CPU build)")
    ap.add_argument("--parallel", type=int, default=max(1, (os.cpu_count() or 4) // 3),
                    help="ops: test-backend-ops processes at once (default cores/3: each CPU reference runs 4 threads)")
    ap.add_argument("--op-timeout", type=int, default=300, help="ops: seconds per op process")
    ap.add_argument("--part-timeout", type=int, default=300, help="ops: seconds per FLASH_ATTN_EXT part")
    ap.add_argument("--part-workers", type=int, default=3, help="ops: test-backend-ops -j for FLASH_ATTN_EXT parts")
    ap.add_argument("--no-fa-parts", dest="fa_parts", action="store_false", help="ops: FLASH_ATTN_EXT in one process")
    ap.add_argument("--soak-build", default="patched", help="soak: BUILD[@DISPATCH] whose llama-server runs (default patched)")
    ap.add_argument("--soak-models", default=",".join(ac.SOAK_MODELS), help="soak: presets (deepseek-v4-flash-4l: WORK/v4-4l.gguf)")
    ap.add_argument("--soak-type", default="ud-q8-k-xl", help="soak: the tiny presets' weight type (default ud-q8-k-xl)")
    ap.add_argument("--max-length", type=int, default=max(ac.SOAK_LENGTHS), help="soak: prompt lengths 1..N (default 100)")
    ap.add_argument("--ub", type=int, default=max(ac.UB_RANGE), help="soak: -ub 1..N on the 4-layer V4 (0: none; default 16)")
    ap.add_argument("--ub-values", default="", help="soak: these -ub values instead of 1..N (43,64,128: the ubatches a "
                    "MUL_MAT_ID patch routes differently)")
    ap.add_argument("--ub-lengths", type=int, default=max(ac.UB_LENGTHS), help="soak: prompt lengths 1..N at each -ub (default 40)")
    ap.add_argument("--token-specs", default="pin,patched,pin@a100,patched@a100", help="tokens: gpu-token-check's specs")
    ap.add_argument("--sanitizer-build", default="patched", help="sanitizer: BUILD[@DISPATCH] (default patched)")
    ap.add_argument("--tools", default="memcheck,racecheck", help="sanitizer: compute-sanitizer tools (runs of the other "
                    "kept from an earlier sanitizer.json: memcheck in one job, racecheck in a later one)")
    ap.add_argument("--memcheck-timeout", type=int, default=300)
    ap.add_argument("--racecheck-timeout", type=int, default=300)
    dsp.add_arguments(ap)
    ap.set_defaults(dispatch="a100")
    a = ap.parse_args()
    global D
    D = dsp.from_args(a, build_dir=a.work)
    try:
        for spec in a.builds.split(",") + [a.soak_build, a.sanitizer_build] + a.token_specs.split(","):
            D.split(spec)
    except dsp.DispatchError as e:
        ap.error(str(e))
    if set(a.tools.split(",")) - {"memcheck", "racecheck"}:
        ap.error(f"--tools {a.tools}: memcheck, racecheck or both")
    try:
        ub_sweep(a)
    except ValueError as e:
        ap.error(str(e))
    if a.parallel < 1 or a.part_workers < 1 or a.max_length < 1 or a.ub < 0 or a.ub_lengths < 1:
        ap.error("--parallel, --part-workers, --max-length and --ub-lengths take N >= 1, --ub N >= 0")
    w = a.work
    os.makedirs(os.path.join(w, "a100"), exist_ok=True)
    return stages.run(stages.expand(a.stages, ["ops", "soak", "tokens", "sanitizer"]), STAGES, a, w, os.path.join(w, "a100"))

if __name__ == "__main__":
    sys.exit(main())
