"""Issue 23's decode-path figures: python -m lab.runs.gpu_decode's raw output -> lab/results/gpu-decode.json -> lab/notes/benchmarks.md.

``summarize`` keeps what a reader compares (tokens/s of the pin and of each patch level measured side by
side in one run, kernels per forward, time per kernel family, test-backend-ops per op); ``section``
renders it. The raw file (lab/results/gpu-decode-raw.json) stays committed beside it, so the summary
is always regenerated, never typed.
"""

from __future__ import annotations

from typing import Any

from pyllm_a100.bench.profile import kernel_family

# DeepSeek-V4-Flash, 43 layers x 16 routed experts kept (6 used per token), ud-q8-k-xl mix: weights read per
# decoded token (pyllm doctor's roofline on that file, issue 23) and the H200's HBM bandwidth.
ACTIVE_BYTES_43L = 10.7e9
H200_BANDWIDTH = 4.8e12
A100_BANDWIDTH = 2.039e12
def _families(ncu: dict) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, v in ncu["name"].items():
        fam = out.setdefault(kernel_family(name), {"count": 0, "us": 0.0})
        fam["count"] += v["count"]
        fam["us"] = round(fam["us"] + v["total_us"], 1)
    return out


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    bench, ncu = raw.get("bench") or {}, raw.get("ncu") or {}
    ops = {k: v for key in sorted(raw) if key == "ops" or key.startswith("ops-") for k, v in (raw[key] or {}).items()}
    rows = []
    for layers in ("43l", "4l"):
        cols = bench.get(layers) or {}
        if "pin" not in cols:
            continue
        # the shipped configuration: the build with every patch, or the column the run names (an env switch that a
        # patch's default now matches, e.g. p0023+NOHC after 0022 became opt-in)
        last = raw.get("shipped_column") or [c for c in bench["columns"] if "+" not in c][-1]
        pin, patched = cols["pin"], cols[last]
        row = {"model": "deepseek-v4-flash", "layers": int(layers[:-1]), "experts": 16, "type": "ud-q8-k-xl",
               "pin_tps": pin["decode_tps"], "patched_tps": patched["decode_tps"],
               "decode_ratio": round(patched["decode_tps"] / pin["decode_tps"], 3),
               "pin_prefill_tps": pin["prefill_tps"], "patched_prefill_tps": patched["prefill_tps"],
               "prefill_ratio": round(patched["prefill_tps"] / pin["prefill_tps"], 3),
               "levels": {c: {"decode_tps": v["decode_tps"], "prefill_tps": v["prefill_tps"]} for c, v in cols.items()}}
        if layers == "43l":
            row["hbm_ceiling_tps_h200"] = round(H200_BANDWIDTH / ACTIVE_BYTES_43L, 1)
            row["pin_pct_of_ceiling"] = round(100 * pin["decode_tps"] * ACTIVE_BYTES_43L / H200_BANDWIDTH, 1)
            row["patched_pct_of_ceiling"] = round(100 * patched["decode_tps"] * ACTIVE_BYTES_43L / H200_BANDWIDTH, 1)
        rows.append(row)
    kernels = {}
    for label in ("pin", "patched"):
        if label in ncu:
            kernels[label] = {"layers": 4, "kernels_per_forward": ncu[label]["kernels_per_forward"],
                              "kernel_us_per_forward": ncu[label]["kernel_us_per_forward"], "families": _families(ncu[label])}
    op_rows = {}
    for key, v in ops.items():
        if isinstance(v, dict) and ":" in key:
            label, op = key.split(":", 1)
            build, *env = label.split("+")  # patched+GGML_CUDA_...: an op run with a switch set; a run without one wins
            if env and build in op_rows.get(op, {}):
                continue
            op_rows.setdefault(op, {})[build] = {"passed": v["ok"], "failed": v["fail"], **({"env": env} if env else {})}
    steps = (raw.get("build") or {}).get("steps", [])
    # the patches the run's builds applied (a run's "patches" field once listed a stale folder: the fifth run's said 0027)
    patches = [name for s in steps for name in s.get("patches", [])] or raw.get("patches")
    out = {"gpu": raw.get("gpu"), "patches": patches, "build_seconds": [s.get("seconds") for s in
           steps], "rows": rows, "kernels": kernels, "test_backend_ops": op_rows,
           **({k: raw[k] for k in ("column_notes", "ncu_note", "ops_note") if raw.get(k)}),
           "command": "python -m lab.runs.gpu_decode --src .carry/llama.cpp-src.tar.gz build models bench ncu ops  (GPU machine; "
                      "then python -m lab.runs.gpu_decode report; lab/notes/gpu-state.md)"}
    if raw.get("tokens"):
        cases = raw["tokens"].get("summary") or {}
        out["greedy_tokens"] = {"all_equal_to_pin": raw["tokens"].get("all_equal"), "cases": len(cases),
                                "differing": sorted(k for k, v in cases.items() if not v["equal_to_pin"]),
                                **({"note": raw["tokens"]["note"]} if raw["tokens"].get("note") else {})}
    if raw.get("concurrency"):
        out["concurrency"] = _concurrency(raw["concurrency"])
        if raw["concurrency"].get("note"):
            out["concurrency"]["note"] = raw["concurrency"]["note"]
    if raw.get("serving_run"):  # a later run of the serving side only: batched decode and the server at N streams
        out["serving_run"] = _serving(raw["serving_run"])
    if raw.get("bench_sweep"):  # the run's other bench: one switch at a time against the same pin
        sweep = raw["bench_sweep"]
        out["sweep"] = {c: {layers: (sweep.get(layers) or {}).get(c, {}).get("decode_tps") for layers in ("43l", "4l")}
                        for c in sweep.get("columns", [])}
    if raw.get("earlier_runs"):
        out["earlier_runs"] = [{k: v for k, v in summarize(e).items() if k in ("patches", "rows", "kernels", "test_backend_ops",
                                                                             "concurrency")} for e in raw["earlier_runs"]]
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _levels_by_column(conc: dict[str, Any]) -> dict[int, dict[str, dict[str, list[float]]]]:
    """python -m lab.runs.gpu_concurrency's runs -> {streams: {column: {"tps": [each run's aggregate], "forwards_per_step": [...]}}}."""
    levels: dict[int, dict[str, dict[str, list[float]]]] = {}
    for run in conc.get("runs", []):
        for lv in (run.get("result") or {}).get("levels", []):
            col = levels.setdefault(lv["concurrency"], {}).setdefault(run["build"], {"tps": [], "forwards_per_step": []})
            col["tps"].append(round(lv["aggregate_tps"], 1))
            if lv.get("forwards_per_step") is not None:
                col["forwards_per_step"].append(lv["forwards_per_step"])
    return dict(sorted(levels.items()))


def _concurrency(conc: dict[str, Any]) -> dict[str, Any]:
    """python -m lab.runs.gpu_concurrency's runs (pin, patched, patched, pin) -> per level: each run's aggregate tokens/s and the ratio of means."""
    rows = []
    for n, by in _levels_by_column(conc).items():
        pin, patched = (by.get("pin") or {}).get("tps", []), (by.get("patched") or {}).get("tps", [])
        ratio = round(_mean(patched) / _mean(pin), 3) if pin and patched else None
        rows.append({"streams": n, "pin_tps": pin, "patched_tps": patched, "ratio_of_means": ratio})
    return {"model": conc.get("model"), "rows": rows}


def _serving(run: dict[str, Any]) -> dict[str, Any]:
    """A serving run (lab/notes/gpu-state.md, ninth run): llama-batched-bench per sequence count (S_TG of every round per
    column), and python -m lab.runs.gpu_concurrency's columns with the forwards each decode step cost (graph-count)."""
    batched = (run.get("batched") or {}).get("43l") or {}
    seqs = sorted({int(n) for col in batched.values() for n in (col.get("tg_tps") or {})})
    out: dict[str, Any] = {k: run[k] for k in ("gpu", "patches", "note") if run.get(k)}
    out["batched"] = [{"sequences": n, **{f"{c}_tps": [round(x["speed_tg"], 1) for x in col.get(str(n), [])] for c, col in batched.items()},
                       **{f"{c}_prefill_tps": [round(x["speed_pp"]) for x in col.get(str(n), [])] for c, col in batched.items()}}
                      for n in seqs]
    for row in out["batched"]:
        if row.get("pin_tps") and row.get("patched_tps"):
            row["ratio_of_means"] = round(_mean(row["patched_tps"]) / _mean(row["pin_tps"]), 3)
            row["prefill_ratio_of_means"] = round(_mean(row["patched_prefill_tps"]) / _mean(row["pin_prefill_tps"]), 3)
    for key in ("concurrency", "slot_choice"):
        conc = run.get(key)
        if not conc:
            continue
        cols = conc.get("columns") or []
        rows = []
        for n, by in _levels_by_column(conc).items():
            base = by.get(cols[0] if cols else "pin")
            rows.append({"streams": n, "columns": by, "ratio_of_means": {c: round(_mean(v["tps"]) / _mean(base["tps"]), 3)
                                                                         for c, v in by.items()} if base else {}})
        out[key] = {"model": conc.get("model"), "parallel": conc.get("parallel"), "columns": cols, "rows": rows}
    return out


def _serving_tables(s: dict[str, Any]) -> list[str]:
    out = [f"\n### Serving run ({s.get('gpu', 'one GPU')}; patches up to {s['patches'][-1][:4] if s.get('patches') else '?'})\n"]
    if s.get("batched"):
        out += ["llama-batched-bench on the 43-layer file (`-npp 256 -ntg 64`; N sequences decode together, one ubatch of N "
                "tokens a step, so the batched kernels without the server's scheduling), decode tokens/s of all sequences, "
                "runs in the order pin, patched, patched, pin:\n",
                "| sequences | pin | patched | ratio of means | prefill ratio |", "| ---: | --- | --- | ---: | ---: |"]
        out += [f"| {r['sequences']} | {', '.join(map(str, r.get('pin_tps', [])))} | {', '.join(map(str, r.get('patched_tps', [])))} | "
                f"{r.get('ratio_of_means', '-')} | {r.get('prefill_ratio_of_means', '-')} |" for r in s["batched"]]
    for key, what in (("concurrency", "pin against patched"), ("slot_choice", "patch 0044 on and off in one binary")):
        c = s.get(key)
        if not c:
            continue
        out += [f"\nscripts/gpu-concurrency, {what} ({c['model']}, llama-server -np {c['parallel']}, 256-token prompts, 64 tokens, "
                f"2 requests a stream, columns {', '.join(c['columns'])} then reversed): aggregate tokens/s, and forwards per "
                "decode step (graph evaluations x streams / generated tokens, lab/scripts/graph-count.c):\n",
                "| streams | column | tok/s (runs) | forwards per step | ratio of means |", "| ---: | --- | --- | --- | ---: |"]
        for r in c["rows"]:
            out += [f"| {r['streams']} | {col} | {', '.join(map(str, v['tps']))} | {', '.join(map(str, v['forwards_per_step'])) or '-'} | "
                    f"{r['ratio_of_means'].get(col, '-')} |" for col, v in r["columns"].items()]
    if s.get("note"):
        out.append(f"\n{s['note']}")
    return out


def _concurrency_table(c: dict[str, Any], when: str) -> list[str]:
    return [f"\nAggregate decode under concurrency{when} ({c['model']}, python -m lab.runs.gpu_concurrency: `pyllm bench --url` against each "
            "build's llama-server -np 32, 256-token prompts, 64 tokens, runs in the order pin, patched, patched, pin):\n",
            "| streams | pin tok/s (2 runs) | patched tok/s (2 runs) | ratio of means |", "| ---: | --- | --- | ---: |"] + [
            f"| {r['streams']} | {', '.join(map(str, r['pin_tps']))} | {', '.join(map(str, r['patched_tps']))} | {r['ratio_of_means']} |"
            for r in c["rows"]]


def _decode_table(cols: dict[str, tuple[Any, Any]], notes: dict[str, str]) -> list[str]:
    """Build -> (43-layer, 4-layer) decode tokens/s as table lines, with each build's note when the run has notes."""
    return (["| build | 43 layers | 4 layers |" + (" what it is |" if notes else ""), "| --- | ---: | ---: |" + (" --- |" if notes else "")]
            + [f"| {c} | {big} | {small} |" + (f" {notes.get(c, '')} |" if notes else "") for c, (big, small) in cols.items()])


def section(summary: dict[str, Any] | None) -> str:
    """The "decode path" section of lab/notes/benchmarks.md."""
    if not summary:
        return "## 5. Decode path (issue 23)\n\nNot measured: run `python -m lab.runs.gpu_decode` on the GPU machine.\n"
    out = [f"""## 5. Decode path: the pin against our patches (issue 23)

One H200 running the sm_80 build (PTX JIT, warmed up first), `llama-bench -p 512 -n 64 -r 3 -ngl 99 -fa 1`, every
build in the same run, interleaved rounds; {summary['gpu']}. Patches: {', '.join(p[:4] for p in summary['patches'])}
(each level includes the ones before it).

| model | layers | pin decode | patched decode | ratio | pin pp512 | patched pp512 | ratio | % of HBM ceiling (pin → patched) |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"""]
    for r in summary["rows"]:
        pct = f"{r['pin_pct_of_ceiling']} → {r['patched_pct_of_ceiling']} % of {r['hbm_ceiling_tps_h200']}" if "pin_pct_of_ceiling" in r else "-"
        out.append(f"| {r['model']} ({r['experts']} experts, {r['type']}) | {r['layers']} | {r['pin_tps']} | {r['patched_tps']} | "
                   f"{r['decode_ratio']}x | {r['pin_prefill_tps']:.0f} | {r['patched_prefill_tps']:.0f} | {r['prefill_ratio']}x | {pct} |")
    out.append("\nEach level, decode tokens/s (43 layers / 4 layers):\n")
    notes = summary.get("column_notes") or {}
    big = next((r for r in summary["rows"] if r["layers"] == 43), None)
    small = next((r for r in summary["rows"] if r["layers"] == 4), None)
    if big:
        small_levels = small["levels"] if small else {}
        out += _decode_table({c: (v["decode_tps"], small_levels.get(c, {}).get("decode_tps", "-")) for c, v in big["levels"].items()}, notes)
    if summary.get("serving_run"):
        out += _serving_tables(summary["serving_run"])
    k, when = summary["kernels"], ""
    if not ("pin" in k and "patched" in k):  # ncu did not run: the newest run that has the table
        e = next((e for e in summary.get("earlier_runs", []) if "pin" in e.get("kernels", {}) and "patched" in e["kernels"]), None)
        k, when = (e["kernels"], f"; from an earlier run, patches up to {e['patches'][-1][:4]}: ncu did not run in this one") if e else (k, "")
    if "pin" in k and "patched" in k:
        out.append(f"\nKernels in one 4-layer forward (ncu, one graph node each{when}): **{k['pin']['kernels_per_forward']} → "
                   f"{k['patched']['kernels_per_forward']}**, {k['pin']['kernel_us_per_forward']:.0f} → "
                   f"{k['patched']['kernel_us_per_forward']:.0f} us of kernel time."
                   + (f" {summary['ncu_note']}" if summary.get("ncu_note") and not when else "") + " By kernel family:\n")
        out += ["| kernel | pin: count, us | patched: count, us |", "| --- | ---: | ---: |"]
        fams = sorted(set(k["pin"]["families"]) | set(k["patched"]["families"]),
                      key=lambda f: -max(k["pin"]["families"].get(f, {}).get("us", 0), k["patched"]["families"].get(f, {}).get("us", 0)))
        for f in fams[:16]:
            a, b = k["pin"]["families"].get(f, {}), k["patched"]["families"].get(f, {})
            out.append(f"| `{f}` | {a.get('count', 0)}, {a.get('us', 0):.0f} | {b.get('count', 0)}, {b.get('us', 0):.0f} |")
    ops = summary["test_backend_ops"]
    if ops:
        out += ["\n`test-backend-ops test -b CUDA0 -o OP` (GPU against the CPU backend):\n", "| op | pin | patched |", "| --- | --- | --- |"]
        for op, v in ops.items():
            cell = lambda x: (f"{x['passed']} passed, {x['failed']} failed" + (f" ({', '.join(x['env'])})" if x.get("env") else "")  # noqa: E731
                              if x else "-")
            out.append(f"| {op} | {cell(v.get('pin'))} | {cell(v.get('patched'))} |")
    if ops and summary.get("ops_note"):
        out.append(f"\n{summary['ops_note']}")
    if summary.get("greedy_tokens"):
        g = summary["greedy_tokens"]
        out.append(f"\nGreedy tokens (python -m lab.runs.gpu_token_check: tiny and 4-layer V4, 8- and 300-token prompts, 48 tokens, -ub 64): "
                   f"{'every build equal to the pin' if g['all_equal_to_pin'] else 'differ: ' + ', '.join(g['differing'])} "
                   f"({g['cases']} cases)." + (f" {g['note']}" if g.get("note") else ""))
    if summary.get("sweep"):
        out.append("\nThe run's other bench (the same binaries, one switch at a time), decode tokens/s:\n")
        out += _decode_table({c: (v["43l"], v["4l"]) for c, v in summary["sweep"].items()}, notes)
    if summary.get("concurrency"):
        out += _concurrency_table(summary["concurrency"], "")
        if summary["concurrency"].get("note"):
            out.append(f"\n{summary['concurrency']['note']}")
    for e in summary.get("earlier_runs", []):
        out += [f"\nAn earlier run (patches up to {e['patches'][-1][:4]}, each level its own build), decode tokens/s:\n",
                "| build | 43 layers | 4 layers |", "| --- | ---: | ---: |"]
        big = next((r for r in e["rows"] if r["layers"] == 43), {"levels": {}})
        small = next((r for r in e["rows"] if r["layers"] == 4), {"levels": {}})
        out += [f"| {c} | {v['decode_tps']} | {small['levels'].get(c, {}).get('decode_tps', '-')} |" for c, v in big["levels"].items()]
        if e.get("concurrency"):
            out += _concurrency_table(e["concurrency"], " in that run")
        ops = e.get("test_backend_ops") or {}
        if ops:
            out.append("\ntest-backend-ops in that run (pin / patched): " + "; ".join(
                f"{op} {v.get('pin', {}).get('passed', '-')}/{v.get('patched', {}).get('passed', '-')} passed, "
                f"{v.get('patched', {}).get('failed', 0)} failed" for op, v in ops.items()) + ".")
    out.append(f"\nReproduce: `{summary['command']}`.\n")
    return "\n".join(out)
