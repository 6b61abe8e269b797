"""docs/performance.md's multi-token sections (issue 42), rendered from lab/results/gpu-multitoken.json (render():
the 43-layer file, MULTITOKEN markers) and lab/results/gpu-multitoken-shapes.json (render_shapes(): the other shapes
and the ceilings of speculative decoding, MULTITOKEN_SHAPES markers); python -m lab.benchmarks.report calls both.

What a row holds: what one step of k tokens costs against one decode step, pin vs patched, under the native and the A100
dispatch (verify: llama-bench ``-p k -d DEPTH``, k = 1 its tg step), N sequences decoding together (batched:
llama-batched-bench), a synthetic draft's own cost per step (draft) and what speculative decoding would make of it
(projection), and the weights a k-token forward reads against one token's (weights_read, pyllm_a100/models/roofline.py):
  {model, layers, dispatch, verify: [{k, pin_ms, patched_ms}], batched: [{sequences, pin_tps, patched_tps}],
   draft: {type, pin_ms, patched_ms}, projection: [{accept_len, k, plain_tps, projected_tps}],
   experts, weights_read: [{k, ratio}], labels}
The run that measured them (python -m lab.runs.gpu_multitoken) left the tree with issue 60:
``git show cf107d3:lab/runs/gpu_multitoken.py`` and ``cf107d3:lab/bench/multitoken.py`` (its stages' parsers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyllm_a100.bench.verify import ceiling
from pyllm_a100.bench.speculate import ACCEPT_LENS, K_REF
from pyllm_a100.bench.speculate import acceptance_for as acceptance

MULTITOKEN_TABLE = ("<!-- multitoken-table -->", "<!-- /multitoken-table -->")
MULTITOKEN_SHAPES = ("<!-- multitoken-shapes -->", "<!-- /multitoken-shapes -->")
PROJECTION_RULE = (f"a solves E(a, {K_REF}) = accept_len (E(a, d) = (1 - a^(d+1)) / (1 - a), "
                   "pyllm_a100/bench/verify.py); for verify width k (k - 1 drafted tokens): projected_tps = "
                   "E(a, k - 1) / (verify_ms(k) + draft_ms(k)) x 1000, draft_ms(k) = the draft's per-step cost (DSpark, "
                   "k - 1 <= its block) or its per-token cost x (k - 1) (MTP); k = 1 is plain decoding; patched build")
ROLES = ("pin", "patched")  # the two builds every row compares


# --- docs/performance.md's section ----------------------------------------------------------------------------------

RENDER_KS = (2, 4, 8, 16)
RENDER_NS = (1, 8, 16, 32)
SHAPES_KS = (2, 4, 7, 8, 16)  # 7 -> 8: where MXFP4's MUL_MAT_ID leaves MMVQ for MMQ on sm_80 code


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _ratio_cells(v: Mapping[int, Mapping[str, Any]], build: str, ks: Sequence[int]) -> list[str]:
    """build's ms at each k over its one-token ms, formatted ("-" where either is missing)."""
    one = (v.get(1) or {}).get(f"{build}_ms")
    return [_fmt(ms / one if one and ms else None, ".2f") for ms in ((v.get(k) or {}).get(f"{build}_ms") for k in ks)]


def _batched_table(main: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["N sequences decoding together (llama-batched-bench), aggregate tokens/s:", "",
             "| dispatch | build | " + " | ".join(f"N={n}" for n in RENDER_NS) + " |",
             "| --- | --- |" + " ---: |" * len(RENDER_NS)]
    for r in main:
        b = {x["sequences"]: x for x in r["batched"]}
        for build in ROLES:
            lines.append(f"| {r['dispatch']} | {build} | " + " | ".join(_fmt((b.get(n) or {}).get(f"{build}_tps"), ".1f")
                                                                        for n in RENDER_NS) + " |")
    return lines


def render(data: Mapping[str, Any] | None) -> str:
    """The generated section: verify cost k/1 for pin and patched under both dispatches, batched tok/s at N = 1, 8, 16,
    32, the draft's cost, the best projected k. ``None`` (no results file yet): one line saying so."""
    if not data or not data.get("rows"):
        return ("Multi-token cost curves (verify of k tokens, N sequences, draft cost, speculative projection): not "
                "measured yet (lab/results/gpu-multitoken.json: python -m lab.runs.gpu_multitoken at commit cf107d3).\n")
    rows = list(data["rows"])
    big = max(r["layers"] for r in rows)
    main = [r for r in rows if r["layers"] == big]
    if not any(r["verify"] for r in main):  # e.g. only the batched stage ran
        lines = [f"Multi-token steps on {main[0]['model']} ({big} layers): only the batched figures are measured yet "
                 "(lab/results/gpu-multitoken.json).", ""]
        return "\n".join(lines + _batched_table(main)) + "\n"
    lines = [f"Multi-token steps on {main[0]['model']} ({big} layers; synthetic weights; {data.get('gpu', 'GPU').split(',')[0]} "
             "running the sm_80 code; `a100` = the host dispatch an A100 gets, lab/scripts/a100-dispatch.c). Generated from "
             "lab/results/gpu-multitoken.json by `python -m lab.benchmarks.report`"
             + (f"; measured {data['started'][:10]}, `patched` = vendor/patches as it was that day (later patches: the "
                "other files below and lab/notes/gpu-state.md)" if data.get("started") else "") + ".", "",
             "One forward of k tokens against one decode step (k/1; llama-bench, depth "
             f"{(data.get('settings') or {}).get('depth', '?')}):", "",
             "| dispatch | build | 1 token, ms | " + " | ".join(f"k={k}" for k in RENDER_KS) + " |",
             "| --- | --- | ---: |" + " ---: |" * len(RENDER_KS)]
    for r in main:
        v = {x["k"]: x for x in r["verify"]}
        for build in ROLES:
            one = (v.get(1) or {}).get(f"{build}_ms")
            cells = _ratio_cells(v, build, RENDER_KS)
            lines.append(f"| {r['dispatch']} | {build} | {_fmt(one, '.2f')} | " + " | ".join(cells) + " |")
    lines += ["", *_batched_table(main), ""]
    for r in main:
        d = r["draft"]
        best = []
        for L in sorted({p["accept_len"] for p in r["projection"]}):
            ps = [p for p in r["projection"] if p["accept_len"] == L]
            top = max(ps, key=lambda p: p["projected_tps"])
            best.append(f"accept length {L}: k = {top['k']}, {top['projected_tps']:.1f} tok/s "
                        f"({top['projected_tps'] / top['plain_tps']:.2f}x plain {top['plain_tps']:.1f})")
        if d["patched_ms"] is None:
            lines.append(f"- {r['dispatch']}: {d['type']} draft not measured, so no projection.")
            continue
        lines.append(f"- {r['dispatch']}: {d['type']} draft {_fmt(d['patched_ms'], '.2f')} ms per step (pin "
                     f"{_fmt(d['pin_ms'], '.2f')}); best projected (patched): " + ("; ".join(best) or "no projection") + ".")
    lines += ["", f"Projection, not a measurement: {data.get('projection_rule', PROJECTION_RULE)}."]
    return "\n".join(lines) + "\n"


def ceilings(rows: Iterable[Mapping[str, Any]], accept_lens: Sequence[float] = ACCEPT_LENS,
             k_ref: int = K_REF) -> list[dict]:
    """What speculative decoding can give at most on one GPU, per file and mean accepted length: the best over verify
    widths k = 2..k_ref + 1 (DSpark's block) of E(a, k - 1) / cost(k), with the draft free and no host work. cost(k) is
    the weights a k-token forward must read against one token's (``bound``: no kernel at equal bandwidth does better
    with uniform routing) or the patched build's measured k/1 per dispatch (``measured``: what the kernels allow today).
    [{model, layers, experts, accept_len, bound: {k, x}, measured: {dispatch: {k, x, build}}}], rows without weights
    skipped; of several rows of one file and dispatch, the last (the newest run) gives ``measured``."""
    out: dict[tuple, dict] = {}
    for r in rows:
        if not r.get("weights_read"):
            continue
        key = (r["model"], r["layers"], r.get("experts"))
        w = {x["k"]: x["ratio"] for x in r["weights_read"]}
        v = {x["k"]: x.get("patched_ms") for x in r.get("verify") or []}
        measured = {k: ms / v[1] for k, ms in v.items() if ms and v.get(1)}
        for L in accept_lens:
            a = acceptance(L, k_ref)
            item = out.setdefault(key + (L,), {"model": key[0], "layers": key[1], "experts": key[2], "accept_len": L,
                                               "measured": {}})
            d, x = ceiling(a, w, k_ref)  # drafted tokens; the verify forward is d + 1 wide
            item["bound"] = {"k": d + 1, "x": round(x, 2)}
            if measured:
                d, x = ceiling(a, measured, k_ref)
                item["measured"][r["dispatch"]] = {"k": d + 1, "x": round(x, 2),
                                                   "build": (r.get("labels") or {}).get("patched", "patched")}
    return list(out.values())


def _render_ceilings(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    items = ceilings(rows)
    if not items:
        return []
    dispatches = sorted({d for c in items for d in c["measured"]}, key=lambda d: (d != "native", d))

    def cell(c: Mapping[str, Any] | None) -> str:
        return "-" if not c else f"{c['x']:.2f}x (k = {c['k']}" + (f", {c['build']})" if c.get("build") else ")")

    lines = ["", "What speculative decoding can give at most on one GPU, from the same runs: the best over verify widths "
             f"k = 2..{K_REF + 1} (up to DSpark's block of {K_REF}) of the tokens a step yields, E(a, k - 1), over the "
             "step's cost, with the draft free and no host work. Cost = the weights read (`bound`: no kernel does better "
             "at equal bandwidth when tokens pick experts independently) or the patched build's measured k/1 (what the "
             "kernels allow today). Trained routers that send neighbouring tokens to the same experts read fewer weights and "
             "raise the bound; only real weights say by how much (`pyllm bench speculate` on your model: its `at most` "
             "column is this bound).", "",
             "| model | layers | experts | tokens a step (accept length) | bound | " +
             " | ".join(f"measured, {d}" for d in dispatches) + " |",
             "| --- | ---: | ---: | ---: | ---: |" + " ---: |" * len(dispatches)]
    for c in items:
        lines.append(f"| {c['model']} | {c['layers']} | {c.get('experts') or '-'} | {c['accept_len']:g} | "
                     f"{cell(c.get('bound'))} | " + " | ".join(cell(c["measured"].get(d)) for d in dispatches) + " |")
    return lines


def render_shapes(data: Mapping[str, Any] | None) -> str:
    """The generated section for the other shapes (cut and real-expert files):
    k/1 per model, dispatch and build, and the weights a k-token forward reads against one token's."""
    if not data or not data.get("rows"):
        return ("Other shapes (DeepSeek-V4 with all 256 experts, GLM-5's 78 layers): not measured yet "
                "(lab/results/gpu-multitoken-shapes.json).\n")
    gpus = sorted({(r.get("gpu") or data.get("gpu") or "GPU").split(",")[0] for r in data["rows"]})
    lines = [f"The same measurement on other files ({' and '.join(gpus)} running the sm_80 code; "
             "generated from lab/results/gpu-multitoken-shapes.json by `python -m lab.benchmarks.report`). k/1 as above; "
             "`weights read` is what a k-token forward must read against one token: every non-expert weight once and each "
             "routed expert at least one token is sent to (independent uniform routing, the file's own tensor sizes; "
             "trained routers on real text share experts somewhat more). A k/1 far above it is a kernel paying per token "
             "what it could pay per expert; k/1 can come in under it, since a one-token step also pays costs that do not "
             "grow with k (launches, attention, norms). `build`: the vendor/patches series measured; the rows of one file "
             "come from one run, side by side.", "",
             "| model | layers | experts | dispatch | build | 1 token, ms | " + " | ".join(f"k={k}" for k in SHAPES_KS) + " |",
             "| --- | ---: | ---: | --- | --- | ---: |" + " ---: |" * len(SHAPES_KS)]
    floors_done = set()
    for r in data["rows"]:
        if not r["verify"]:
            continue
        v = {x["k"]: x for x in r["verify"]}
        head = f"| {r['model']} | {r['layers']} | {r.get('experts', '-')} |"
        for build in ROLES:
            one = (v.get(1) or {}).get(f"{build}_ms")
            if one is None:  # a run of one build only
                continue
            cells = _ratio_cells(v, build, SHAPES_KS)
            label = (r.get("labels") or {}).get(build, build)
            lines.append(f"{head} {r['dispatch']} | {label} | {_fmt(one, '.2f')} | " + " | ".join(cells) + " |")
        key = (r["model"], r["layers"], r.get("experts"))
        if r.get("weights_read") and key not in floors_done:
            floors_done.add(key)
            w = {x["k"]: x["ratio"] for x in r["weights_read"]}
            lines.append(f"{head} - | weights read | - | " + " | ".join(_fmt(w.get(k), ".2f") for k in SHAPES_KS) + " |")
    lines += _render_ceilings(data["rows"])
    return "\n".join(lines) + "\n"
