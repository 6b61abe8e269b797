"""Two builds side by side from one gpu-multitoken run: the series without a new patch (A) and with it (B).

    python -m lab.runs.gpu_ab_table WORK/mt --a prev --b patched [--out FILE.json]

Reads the stage files gpu-multitoken wrote (verify.json, batched.json, ncu.json; any may be missing) and, for each
dispatch the columns ran under (A and A@a100 against B and B@a100), prints and writes:
verify   ms of a forward of k tokens (k = 1: the decode step), mean of the run's passes, and B/A;
batched  aggregate decode tokens/s of N sequences (llama-batched-bench), and B/A;
ncu      the kernel families of one k-token forward whose time changed most between A and B.
gpu-multitoken's own report compares `pin` with `patched`; this compares any two builds of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from lab.bench import multitoken as mt


def load(folder: str, stage: str) -> dict:
    path = os.path.join(folder, f"{stage}.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def name(build: str, dispatch: str) -> str:
    return build if dispatch == "native" else f"{build}@{dispatch}"


def verify_rows(data: dict, a: str, b: str, dispatch: str) -> list[dict]:
    rows = []
    for model in sorted({r["model"] for r in data.get("runs", [])}):
        runs = [r for r in data["runs"] if r["model"] == model and "error" not in r]
        ms_a = mt.verify_ms_means(r for r in runs if r["column"] == name(a, dispatch))
        ms_b = mt.verify_ms_means(r for r in runs if r["column"] == name(b, dispatch))
        for k in sorted(set(ms_a) & set(ms_b)):
            rows.append({"model": model, "k": k, "a_ms": round(ms_a[k], 3), "b_ms": round(ms_b[k], 3),
                         "b_over_a": round(ms_b[k] / ms_a[k], 3),
                         "a_vs_step": round(ms_a[k] / ms_a[1], 2) if 1 in ms_a else None,
                         "b_vs_step": round(ms_b[k] / ms_b[1], 2) if 1 in ms_b else None})
    return rows


def batched_rows(data: dict, a: str, b: str, dispatch: str) -> list[dict]:
    def mean_tps(column: str) -> dict[int, float]:
        acc: dict[int, list[float]] = {}
        for r in data.get("runs", []):
            if r.get("column") == column and "error" not in r:
                for n, tps in r["tps"].items():
                    acc.setdefault(int(n), []).append(tps)
        return {n: sum(v) / len(v) for n, v in acc.items()}

    ta, tb = mean_tps(name(a, dispatch)), mean_tps(name(b, dispatch))
    return [{"sequences": n, "a_tps": round(ta[n], 1), "b_tps": round(tb[n], 1), "b_over_a": round(tb[n] / ta[n], 3)}
            for n in sorted(set(ta) & set(tb))]


def ncu_rows(data: dict, a: str, b: str, dispatch: str, top: int = 8) -> dict:
    cols = data.get("columns", {})
    out = {}
    for key in sorted(set(cols.get(name(a, dispatch), {})) & set(cols.get(name(b, dispatch), {})), key=lambda k: (len(k), k)):
        fa, fb = cols[name(a, dispatch)][key], cols[name(b, dispatch)][key]
        if "families" not in fa or "families" not in fb:
            continue
        ua = {f["family"]: (f["count"], f["us"]) for f in fa["families"]}
        ub = {f["family"]: (f["count"], f["us"]) for f in fb["families"]}
        fams = sorted(set(ua) | set(ub), key=lambda f: -abs(ub.get(f, (0, 0))[1] - ua.get(f, (0, 0))[1]))[:top]
        out[key] = {"a_us": fa["us"], "b_us": fb["us"], "a_kernels": fa["kernels"], "b_kernels": fb["kernels"],
                    "changed": [{"family": f, "a": list(ua.get(f, (0, 0.0))), "b": list(ub.get(f, (0, 0.0)))} for f in fams]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", help="gpu-multitoken's stage files (WORK/mt)")
    ap.add_argument("--a", required=True, help="the build without the change (a gpu-build label)")
    ap.add_argument("--b", required=True, help="the build with it")
    ap.add_argument("--out", help="write the table as JSON here too")
    args = ap.parse_args()
    if not os.path.isdir(args.folder):
        ap.error(f"{args.folder}: no such folder (gpu-multitoken writes WORK/mt)")
    verify, batched, ncu = (load(args.folder, s) for s in ("verify", "batched", "ncu"))
    if not (verify or batched or ncu):
        ap.error(f"{args.folder} holds none of verify.json, batched.json, ncu.json")
    result = {"a": args.a, "b": args.b, "settings": {k: verify.get(k) for k in ("depth", "reps", "decode_tokens")},
              "npp": batched.get("npp"), "ntg": batched.get("ntg"), "commands": {**verify.get("commands", {}),
              **batched.get("commands", {})}, "dispatch": {**verify.get("dispatch", {}), **batched.get("dispatch", {})},
              "by_dispatch": {}}
    for dispatch in ("native", "a100"):
        part = {"verify": verify_rows(verify, args.a, args.b, dispatch),
                "batched": batched_rows(batched, args.a, args.b, dispatch),
                "ncu": ncu_rows(ncu, args.a, args.b, dispatch)}
        if not any(part.values()):
            continue
        result["by_dispatch"][dispatch] = part
        print(f"== dispatch {dispatch}: {args.a} (A) against {args.b} (B)")
        for r in part["verify"]:
            print(f"verify {r['model']} k={r['k']:2d}: A {r['a_ms']:8.3f} ms ({r['a_vs_step']}x step)  B {r['b_ms']:8.3f} ms "
                  f"({r['b_vs_step']}x step)  B/A {r['b_over_a']:.3f}")
        for r in part["batched"]:
            print(f"batched N={r['sequences']:2d}: A {r['a_tps']:7.1f} tok/s  B {r['b_tps']:7.1f} tok/s  B/A {r['b_over_a']:.3f}")
        for key, r in part["ncu"].items():
            print(f"ncu {key}: A {r['a_us']} us ({r['a_kernels']} kernels)  B {r['b_us']} us ({r['b_kernels']} kernels)")
            for f in r["changed"]:
                print(f"    {f['family']:45s} A {f['a'][0]:3d} x {f['a'][1]:8.1f} us   B {f['b'][0]:3d} x {f['b'][1]:8.1f} us")
    if not result["by_dispatch"]:
        print(f"no run of both {args.a} and {args.b} under one dispatch in {args.folder}", file=sys.stderr)
        return 1
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
