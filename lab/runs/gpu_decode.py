"""Issue 23: DeepSeek-V4-Flash single-stream decode, sm_80 build: pin vs our new patches.
  python -m lab.runs.gpu_decode --src PIN.tar.gz [--work /tmp/dec] STAGE...   (all = build models ops bench ncu)
build   pristine pin (.tar.gz or folder) -> WORK/src + vendor/patches/0001-0003, cmake sm_80 Ninja, TARGETS ->
        WORK/pin-bin; then each new patch (0004..; or the --levels groups) in name order, incremental rebuild ->
        WORK/pNNNN-bin; the last is WORK/patched-bin. Copies run with LD_LIBRARY_PATH=their folder.
models  python3 -m pyllm_a100 synth deepseek-v4-flash: 43 and 4 layers, 16 experts, ud-q8-k-xl, seed 42
ops     test-backend-ops test -b CUDA0 -o OP, pin and patched: pass/fail counts
bench   llama-bench -p 512 -n 64 -r 3 -ngl 99 -fa 1, both files, columns BUILD (a build's folder), two interleaved rounds
batched llama-batched-bench -npl 1,8,16,32 (43 layers): N sequences in one ubatch a step, no server scheduling
ncu     ncu --graph-profiling node, llama-bench -p 0 -n 1 and -n 2 (4 layers): the difference is one forward
Patches: vendor/patches here (or $GPU_DECODE_PATCHES). Each stage writes WORK/results/STAGE.json (its failure too);
report merges them into $OUT/gpu-decode.json + .txt; long runs: lab/scripts/gpu-session (lab/notes/gpu-state.md).
Dispatch (issue 41): columns BUILD[@DISPATCH], e.g. --columns pin,patched,pin@a100,patched@a100 (interleaved
like any columns); --dispatch a100 is the default of columns without @ (and of --ops-builds, --ncu-patched, ncu's pin).
@a100 runs the program with lab/scripts/a100-dispatch.c preloaded (built once into WORK, or --dispatch-shim); every
stage's JSON records each column's dispatch and the compute capability llama.cpp logged (lab/bench/dispatch.py)."""
import argparse, glob, json, os, re, shutil, subprocess, sys, tarfile, time

from lab.bench import dispatch as dsp  # BUILD@DISPATCH, the a100-dispatch shim, the reported capability
from lab.bench import stages
from lab.bench.jsonrows import dumps

HERE = os.path.dirname(os.path.abspath(__file__))
PATCHES = sorted(glob.glob(os.path.join(os.environ.get("GPU_DECODE_PATCHES") or os.path.join(HERE, "..", "..", "vendor", "patches"), "*.patch")))
BASE = [p for p in PATCHES if os.path.basename(p)[:4] in ("0001", "0002", "0003")]
NEW = [p for p in PATCHES if p not in BASE]
DISPATCH = dsp.Dispatcher()  # main() replaces it from --dispatch / --dispatch-shim
OPS = ["MUL_MAT", "MUL_MAT_ID", "MUL_MAT_VEC_FUSION", "MUL_MAT_ID_FUSION", "MOE_REDUCE", "MUL", "ADD", "SIGMOID", "SCALE",
       "MUL_ADD_SIGMOID_SCALE", "MUL_MAT_SHARED_SRC1", "DSV4_COMPRESS_POOL", "SOFT_MAX", "SUM_ROWS", "GET_ROWS", "CONCAT",
       "DSV4_HC_CHAIN", "GET_ROWS_SET_ROWS", "GET_ROWS_ADD", "RMS_NORM_ROPE_OFFS", "RMS_NORM_MUL_ROPE", "ROPE"]
TARGETS = ["llama-bench", "test-backend-ops", "llama-server", "llama-perplexity", "llama-quantize", "llama-completion",
           "llama-batched-bench"]
BENCH = ["-ngl", "99", "-fa", "1", "-b", "2048", "-ub", "512", "-o", "json"]

def sh(cmd, log, timeout=None, env=None, cwd=None):
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n"); f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env, cwd=cwd).returncode

def run_env(w, label, extra=None):
    return dict(os.environ, CUDA_CACHE_MAXSIZE="4294967296", LD_LIBRARY_PATH=bindir(w, label), **(extra or {}))

def bindir(w, label):
    return os.path.join(w, f"{label}-bin")

def column(spec):  # "p0027@a100" -> ("p0027", the dispatch's LD_PRELOAD)
    base, disp = DISPATCH.split(spec)
    return base, DISPATCH.env(disp)


def col_name(spec):  # the column as results name it: "patched" (native) or "patched@a100"
    return dsp.column_name(*DISPATCH.split(spec))


def seen(res, name, spec, text):  # the column's dispatch and the capability llama.cpp logged, first run kept
    if name not in res.setdefault("dispatch", {}) or not res["dispatch"][name].get("reported_capability"):
        res["dispatch"][name] = dsp.record(DISPATCH.split(spec)[1], text)

def levels(a):
    """[(label, patches)] after the pin: each new patch its own level, or --levels 0012,0013 (all up to each)."""
    cuts = a.levels.split(",") if a.levels else [os.path.basename(p)[:4] for p in NEW]
    out = [(f"p{c}", [p for p in NEW if prev < os.path.basename(p)[:4] <= c]) for prev, c in zip(["0003"] + cuts, cuts)]
    if not all(batch for _, batch in out):
        raise RuntimeError(f"--levels {a.levels}: a level adds no patch")
    return out


def builds(w):
    labels = sorted((d[:-4] for d in os.listdir(w) if d.endswith("-bin") and d != "patched-bin" and d != "pin-bin"))
    return [l for l in ["pin"] + labels if os.path.exists(os.path.join(bindir(w, l), "llama-bench"))]


def tree_root(d):
    roots = [r for r, dirs, files in os.walk(d) if "CMakeLists.txt" in files and "ggml" in dirs and r.count(os.sep) - d.count(os.sep) <= 4]
    if not roots:
        raise RuntimeError(f"no llama.cpp tree under {d}")
    return min(roots, key=len)


def stage_build(a, w, res):
    src, bld, log = os.path.join(w, "src"), os.path.join(w, "build"), os.path.join(w, "build.log")
    for d in (src, bld):  # fresh pristine tree and build dir: a tar's old mtimes would fool ninja
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(src)
    if os.path.isdir(a.src):
        shutil.copytree(a.src, os.path.join(src, "t"), symlinks=True)
    else:
        tarfile.open(a.src).extractall(src, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    root = tree_root(src)
    res["tree"], res["steps"] = root, []
    cfg = ["cmake", "-S", root, "-B", bld, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON",
           "-DCMAKE_CUDA_ARCHITECTURES=80", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=ON",
           "-DCMAKE_SKIP_BUILD_RPATH=ON"]
    for label, patches in [("pin", BASE)] + levels(a):
        step = {"label": label, "patches": [os.path.basename(p) for p in patches]}
        res["steps"].append(step)
        t0 = time.time()
        for p in patches:
            if sh(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-i", os.path.abspath(p)], log, cwd=root):
                raise RuntimeError(f"{os.path.basename(p)} does not apply with fuzz 0 (see {log})")
        if sh(cfg, log) or sh(["ninja", "-C", bld, f"-j{a.jobs}"] + TARGETS, log):
            raise RuntimeError(f"cmake/ninja for {label} failed (see {log})")
        shutil.rmtree(bindir(w, label), ignore_errors=True)
        shutil.copytree(os.path.join(bld, "bin"), bindir(w, label), symlinks=True)
        json.dump(step, open(os.path.join(bindir(w, label), ".built"), "w"))  # a job waiting on this level may start
        ldd = subprocess.run(["ldd", os.path.join(bindir(w, label), "llama-bench")], capture_output=True, text=True, env=run_env(w, label))
        step.update(seconds=round(time.time() - t0, 1), libggml_cuda=[l.strip() for l in ldd.stdout.splitlines() if "ggml-cuda" in l])
    last = res["steps"][-1]["label"]
    if os.path.lexists(bindir(w, "patched")):
        os.remove(bindir(w, "patched"))
    os.symlink(bindir(w, last), bindir(w, "patched"))
    res["patched_is"] = last

def model_path(w, layers):
    return os.path.join(w, f"v4-{layers}l.gguf")

def stage_models(a, w, res):
    for layers in (4, 43):
        out = model_path(w, layers)
        if os.path.exists(out + ".done"):
            res[f"{layers}l"] = {"path": out, "reused": True}
            continue
        t0 = time.time()
        cmd = [sys.executable, "-m", "pyllm_a100", "synth", "deepseek-v4-flash", "-o", out, "--layers", str(layers),
               "--experts", "16", "--type", "ud-q8-k-xl", "--seed", "42"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if p.returncode:
            raise RuntimeError(f"synth {layers}l failed: {p.stderr[-2000:]}")
        open(out + ".done", "w").write(p.stdout)
        res[f"{layers}l"] = {"path": out, "bytes": os.path.getsize(out), "seconds": round(time.time() - t0, 1),
                             "synth": p.stdout.strip().splitlines()[-1:]}


def stage_ops(a, w, res):
    log = os.path.join(w, "ops.log")
    env = dict(kv.split("=", 1) for kv in a.ops_env)  # e.g. GGML_CUDA_DSV4_POOL_SPLIT=1: an opt-in kernel's tests
    for spec in a.ops_builds.split(","):
        (label, col_env), name = column(spec), col_name(spec)
        exe = os.path.join(bindir(w, label), "test-backend-ops")
        for op in (a.ops.split(",") if a.ops else OPS):
            t0 = time.time()
            try:
                cmd = [exe, "test", "-b", "CUDA0", "-o", op] + (["-p", a.ops_params] if a.ops_params else [])
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.op_timeout, env=run_env(w, label, dict(env, **col_env)))
                out, rc = re.sub(r"\x1b\[[0-9;]*m", "", p.stdout + p.stderr), p.returncode
            except subprocess.TimeoutExpired as e:
                out, rc = f"timeout after {a.op_timeout} s\n" + str(e.stdout or "")[-2000:], "timeout"
            open(log, "a").write(f"\n===== {name} {op} rc={rc}\n{out}")
            lines = [l.strip() for l in out.splitlines()]
            fail = [l for l in lines if re.search(r"FAIL$", l) and "(" in l]
            seen(res, name, spec, out)
            res[f"{name}{''.join('+' + k for k in env)}:{op}"] = {"rc": rc, "ok": sum(bool(re.search(r"\): OK$", l)) for l in lines), "fail": len(fail),
                                    "summary": [l for l in lines if re.search(r"\d+/\d+ tests passed", l)][-1:],
                                    "failed": fail[:20], "seconds": round(time.time() - t0, 1),
                                    "reported_capability": dsp.reported_capability(out)}


def bench_once(w, label, model, env_extra, args, timeout=900, log=None):  # log: a list that gets llama-bench's stderr
    exe = os.path.join(bindir(w, label), "llama-bench")
    p = subprocess.run([exe, "-m", model] + args + BENCH, capture_output=True, text=True, timeout=timeout,
                       env=run_env(w, label, env_extra))
    if log is not None:
        log.append(p.stderr)
    if p.returncode:
        raise RuntimeError(f"llama-bench {label} rc={p.returncode}: {p.stderr[-1500:]}")
    return json.loads(p.stdout[p.stdout.index("["):])


def stage_bench(a, w, res):
    specs = a.columns.split(",") if a.columns else builds(w)
    cols = [(col_name(spec), *column(spec), spec) for spec in specs]
    res["columns"], res["warmup_s"] = [c[0] for c in cols], {}
    for name, label, extra, spec in cols:  # PTX JIT warm-up (sm_80 code on a newer GPU), once per build and dispatch
        key = dsp.column_name(label, DISPATCH.split(spec)[1])
        if key in res["warmup_s"]:
            continue
        t0, log = time.time(), []
        bench_once(w, label, model_path(w, 4), extra, ["-p", "16", "-n", "4", "-r", "1"], log=log)
        res["warmup_s"][key] = round(time.time() - t0, 1)
        seen(res, name, spec, log[-1])
    for layers in map(int, a.bench_layers.split(",")):
        rows = res.setdefault(f"{layers}l", {})
        for rnd, order in enumerate([cols, cols[::-1]] * a.rounds):  # interleaved: A B C .. then .. C B A
            for col, label, extra, spec in order:
                try:
                    log = []
                    for r in bench_once(w, label, model_path(w, layers), extra, ["-p", "512", "-n", "64", "-r", "3"], log=log):
                        test = "decode" if r.get("n_gen") else "prefill"
                        rows.setdefault(col, {}).setdefault(test, []).append(
                            {"round": rnd, "avg_ts": r["avg_ts"], "stddev_ts": r["stddev_ts"], "samples_ts": r.get("samples_ts")})
                except Exception as e:
                    rows.setdefault(col, {}).setdefault("errors", []).append(str(e)[-800:])
                if log:
                    seen(res, col, spec, log[-1])
        for col in rows.values():
            for test in ("decode", "prefill"):
                samples = [s for r in col.get(test) or [] for s in (r["samples_ts"] or [r["avg_ts"]])]
                if samples:
                    col[f"{test}_tps"] = round(sum(samples) / len(samples), 2)
        for name, col in rows.items():  # against the pin of the same dispatch
            base = rows.get(dsp.column_name("pin", DISPATCH.split(name)[1]), {})
            for test in ("decode", "prefill"):
                if base.get(f"{test}_tps") and col.get(f"{test}_tps"):
                    col[f"{test}_vs_pin"] = round(col[f"{test}_tps"] / base[f"{test}_tps"], 3)


def stage_batched(a, w, res):  # llama-batched-bench per column (lab/bench/batched.py), S_TG per -npl
    from lab.bench import batched
    specs = (a.columns or "pin,patched").split(",")
    res["columns"], res["args"] = [col_name(s) for s in specs], ["-npl", a.batched_npl] + batched.ARGS
    spec_of = dict(zip(res["columns"], specs))

    def run_column(name):
        log, (label, env) = [], column(spec_of[name])
        try:
            return batched.run(os.path.join(bindir(w, label), "llama-batched-bench"), model_path(w, 43), a.batched_npl,
                               env=run_env(w, label, env), log=log)
        finally:
            if log:
                seen(res, name, spec_of[name], log[-1])
    res["43l"] = batched.side_by_side(res["columns"], run_column)


def ncu_table(a, w, spec, n_gen, npl=0, res=None):  # the 4-layer file: llama-bench -n N_GEN, or N_GEN steps of npl sequences
    from pyllm_a100.bench.profile import ncu_kernel_tables
    (label, env), rep = column(spec), os.path.join(w, f"ncu-{col_name(spec)}-n{n_gen}-pl{npl}.csv")
    tool = [os.path.join(bindir(w, label), "llama-bench"), "-m", model_path(w, 4), "-p", "0", "-n", str(n_gen), "-r", "1",
            "--no-warmup"] + BENCH[:-2]
    if npl:  # npl sequences of 64 prompt tokens, then N_GEN decode steps of one ubatch of npl tokens each
        tool = [os.path.join(bindir(w, label), "llama-batched-bench"), "-m", model_path(w, 4), "-npp", "64", "-ntg",
                str(n_gen), "-npl", str(npl), "-c", str(npl * 256), "-b", "2048", "-ub", "512", "-ngl", "99", "-fa", "on"]
    try:
        return ncu_kernel_tables(tool, rep, env=run_env(w, label, env), cache_control=a.ncu_cache)
    finally:
        if res is not None and os.path.exists(rep + ".stdout"):  # ncu passes the program's output through
            seen(res, col_name(spec), spec, open(rep + ".stdout", errors="replace").read())


def stage_ncu(a, w, res):  # one forward's kernels (the difference of N_GEN 2 and 1); --ncu-npl N: of N sequences
    from pyllm_a100.bench.profile import forward_difference
    res["patched_spec"], res["cache_control"], res["npl"] = a.ncu_patched, a.ncu_cache, a.ncu_npl
    for label, spec in (("pin", "pin" + ("@" + DISPATCH.split(a.ncu_patched)[1] if "@" in a.ncu_patched else "")),
                        ("patched", a.ncu_patched)):
        res[label] = forward_difference(ncu_table(a, w, spec, 1, a.ncu_npl, res), ncu_table(a, w, spec, 2, a.ncu_npl, res))


def short(k):
    return re.split(r"[<(]", k, 1)[0].replace("void ", "")[:60]


def stage_report(a, w, res):
    allres = {os.path.basename(f)[:-5]: json.load(open(f)) for f in sorted(glob.glob(os.path.join(w, "results", "*.json")))}
    allres["patches"] = [os.path.basename(p) for p in PATCHES]
    allres["dispatch"] = {col: d for r in allres.values() if isinstance(r, dict) and isinstance(r.get("dispatch"), dict)
                          for col, d in r["dispatch"].items()}
    allres["reported_capability"] = {col: d.get("reported_capability") for col, d in allres["dispatch"].items()}
    allres["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,memory.total",
                                    "--format=csv,noheader"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("nvidia-smi") else "no nvidia-smi (CPU machine)"
    lines = [f"gpu-decode  {allres['gpu']}  patches: {', '.join(allres['patches'])}"]
    for st in ("build", "models", "ops", "bench", "batched", "ncu"):
        r = allres.get(st)
        lines.append(f"[{st}] " + ("not run" if r is None else ("ok" if r.get("ok") else f"FAILED: {r.get('error', '')[:300]}")))
        for col, d in ((r or {}).get("dispatch") if isinstance((r or {}).get("dispatch"), dict) else {}).items():
            lines.append(f"    {col}: dispatch {d.get('dispatch')}, llama.cpp reported compute capability "
                         f"{d.get('reported_capability')}" + (f"  PROBLEM: {d['problem']}" if d.get("problem") else ""))
    for layers in ("4l", "43l"):
        for col, v in (allres.get("bench", {}).get(layers) or {}).items():
            lines.append(f"  {layers:>3} {col:<18} decode {v.get('decode_tps', '-'):>8} tok/s (x{v.get('decode_vs_pin', '-')})"
                         f"  prefill {v.get('prefill_tps', '-'):>8} tok/s (x{v.get('prefill_vs_pin', '-')})"
                         + (f"  errors: {len(v['errors'])}" if v.get("errors") else ""))
    lines += [f"  batched 43l {col:<18} decode tok/s by sequences {v.get('tg_tps')} vs pin {v.get('tg_vs_pin')} "
              f"errors {len(v.get('errors', []))}" for col, v in (allres.get("batched", {}).get("43l") or {}).items()]
    for label in ("pin", "patched"):
        n = allres.get("ncu", {}).get(label)
        if n:
            lines.append(f"  ncu {label}: {n['kernels_per_forward']} kernels, {n['kernel_us_per_forward']} us per forward (4 layers)")
            lines += [f"      {v['count']:>4} {v['total_us']:>9.1f} us  {short(k)}" for k, v in list(n["name"].items())[:12]]
    for k, v in (allres.get("ops") or {}).items():
        if isinstance(v, dict) and "ok" in v:
            lines.append(f"  ops {k:<32} ok {v['ok']:>5} fail {v['fail']:>3} {v['summary']}")
    text, out = "\n".join(lines) + "\n", os.environ.get("OUT") or w
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "gpu-decode.json"), "w").write(dumps(allres))  # lab/results/gpu-decode-raw.json
    open(os.path.join(out, "gpu-decode.txt"), "w").write(text)
    print(text)


STAGES = {"build": stage_build, "models": stage_models, "ops": stage_ops, "bench": stage_bench, "batched": stage_batched,
          "ncu": stage_ncu, "report": stage_report}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="+", choices=list(STAGES) + ["all"])
    ap.add_argument("--src", help="pristine pin: the `pyllm vendor pack` .tar.gz, or an extracted folder (build)")
    ap.add_argument("--work", default="/tmp/dec")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 16); ap.add_argument("--op-timeout", type=int, default=900)
    ap.add_argument("--columns", help="bench these columns, e.g. pin,p0006,p0006@a100 (default: every build)")
    ap.add_argument("--ncu-patched", default="patched", help="ncu's patched column, e.g. patched@a100 (default: patched)")
    ap.add_argument("--ncu-npl", type=int, default=0, help="ncu: one decode step of N sequences (llama-batched-bench)")
    ap.add_argument("--ncu-cache", default="all", choices=["all", "none"], help="ncu --cache-control: all (flush before each "
                    "kernel, the earlier runs' figures) or none (warm, as in a real decode step; pyllm bench --profile's)")
    ap.add_argument("--rounds", type=int, default=1, help="bench round pairs (forward + reversed order each)")
    ap.add_argument("--batched-npl", default="1,8,16,32", help="batched: llama-batched-bench -npl (sequences at once)")
    ap.add_argument("--bench-layers", default="4,43", help="bench these files: 43 alone spends the time on the figure that counts")
    ap.add_argument("--levels", help="build levels after the pin: 0012,0013 = patches up to 0012, then to 0013 (default: each)")
    ap.add_argument("--ops", help="test-backend-ops only these ops (default: OPS)")
    ap.add_argument("--ops-env", action="append", default=[], metavar="KEY=VALUE", help="environment for the op runs")
    ap.add_argument("--ops-builds", default="pin,patched", help="builds whose test-backend-ops run (default pin,patched)")
    ap.add_argument("--ops-params", help="test-backend-ops -p REGEX: only the cases whose parameters match, e.g. hsk=512")
    dsp.add_arguments(ap)
    a = ap.parse_args()
    w = a.work
    global DISPATCH
    DISPATCH = dsp.from_args(a, build_dir=w)
    os.makedirs(os.path.join(w, "results"), exist_ok=True)
    run = stages.expand(a.stages, ["build", "models", "ops", "bench", "ncu"])
    try:
        [DISPATCH.split(s) for s in (a.columns or "").split(",") + [a.ncu_patched] + a.ops_builds.split(",") if s]
    except dsp.DispatchError as e:
        ap.error(str(e))
    if not set(a.bench_layers.split(",")) <= {"4", "43"}:
        ap.error(f"--bench-layers {a.bench_layers}: the models stage writes the 4- and 43-layer files (4, 43 or 4,43)")
    if any("=" not in kv for kv in a.ops_env):
        ap.error("--ops-env takes KEY=VALUE, e.g. GGML_CUDA_DSV4_POOL_SPLIT=1")
    if "build" in run and not a.src:
        ap.error("build needs --src")
    stages.run(run, STAGES, a, w, os.path.join(w, "results"), idle=lambda st: "none: no llama.cpp process in this stage")


if __name__ == "__main__":
    main()
