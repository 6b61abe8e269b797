"""Multi-token cost curves (issue 42): what one step of k tokens costs against one decode step, pin vs patched, under
the native and the A100 dispatch, and what speculative decoding would make of it (python -m lab.runs.gpu_multitoken).

* verify: one sequence, one forward of k = 1..16 tokens after the same context (llama-bench ``-p k -d DEPTH``; k = 1
  is a plain decode step as llama-bench tg measures it: ``-n N`` single-token forwards / N);
* batched: N sequences decoding together, N = 1..32 (llama-batched-bench; one ubatch of N tokens a step);
* draft: a synthetic draft's own cost per step (DSpark: its block in one pass; MTP: one NextN forward per drafted
  token): the step with the draft minus the step without it (llama-server timings, acceptance ~0 on random
  weights, so every step verifies the k+1 tokens) minus the extra verify cost verify(k+1) - verify(1), as
  pyllm_a100/bench/draft_costs.py's draft_ms_per_step does;
* projection: for a mean accepted length L per step (accept_len), the per-token acceptance a solving
  E(a, K_REF) = L at the draft length L was measured at (K_REF = 7, DSpark's block), then for each verify width k
  (k - 1 drafted tokens) E(a, k - 1) = (1 - a^k) / (1 - a) tokens per step (speculative.expected_tokens) over
  verify_ms(k) + draft_ms(k) (DSpark: its per-step cost, k <= its block + 1; MTP: per token x (k - 1)).

* weights read: what a forward of k tokens must read from memory against one token, from the file's own tensor
  sizes (pyllm_a100/models/roofline.py): every non-expert byte once, and each routed expert that at least one of the
  k tokens is sent to, n (1 - (1 - u/n)^k) of n experts for u per token with independent uniform routing (the
  synthetic routers' random weights; real routing is correlated between neighbouring tokens and touches fewer).
  A k/1 far above it is a kernel paying per token what it could pay per expert; k/1 can come in a little under it, since
  a one-token step also pays costs that do not grow with k (fourteenth run: 2.18x against 2.37x at k = 8, 256 experts).

Rows of lab/results/gpu-multitoken*.json (rows(); these keys, experts and weights_read only where the run knew them):
  {model, layers, dispatch, verify: [{k, pin_ms, patched_ms}], batched: [{sequences, pin_tps, patched_tps}],
   draft: {type, pin_ms, patched_ms}, projection: [{accept_len, k, plain_tps, projected_tps}],
   experts, weights_read: [{k, ratio}]}
render() turns the 43-layer file into docs/performance.md's generated section (MULTITOKEN markers); render_shapes()
the other shapes' file (MULTITOKEN_SHAPES markers).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyllm_a100.bench.draft_length import ACCEPT_LENS, K_REF
from pyllm_a100.bench.draft_length import acceptance_for as acceptance
from pyllm_a100.bench.draft_costs import ceiling, expected_tokens
from pyllm_a100.models.roofline import WeightsPerToken

MULTITOKEN_TABLE = ("<!-- multitoken-table -->", "<!-- /multitoken-table -->")
MULTITOKEN_SHAPES = ("<!-- multitoken-shapes -->", "<!-- /multitoken-shapes -->")
DRAFTS = {"dspark": {"spec_type": "draft-dspark", "preset": "deepseek-v4-flash-dspark", "per_token": False, "max_draft": 7},
          "mtp": {"spec_type": "draft-mtp", "preset": "deepseek-v4-flash-mtp", "per_token": True, "max_draft": 15}}
PROJECTION_RULE = (f"a solves E(a, {K_REF}) = accept_len (E(a, d) = (1 - a^(d+1)) / (1 - a), "
                   "pyllm_a100/bench/draft_costs.py); for verify width k (k - 1 drafted tokens): projected_tps = "
                   "E(a, k - 1) / (verify_ms(k) + draft_ms(k)) x 1000, draft_ms(k) = the draft's per-step cost (DSpark, "
                   "k - 1 <= its block) or its per-token cost x (k - 1) (MTP); k = 1 is plain decoding; patched build")


# --- llama-bench / llama-batched-bench arguments and their output ------------------------------------------------

def verify_args(ks: Sequence[int], depth: int, reps: int, decode_tokens: int) -> list[str]:
    """llama-bench arguments: a prompt test per k (one forward of k tokens at depth) and a tg test of decode_tokens."""
    return ["-p", ",".join(map(str, ks)), "-n", str(decode_tokens), "-d", str(depth), "-r", str(reps),
            "-b", "2048", "-ub", str(max(512, max(ks))), "-ngl", "99", "-fa", "1", "-o", "json"]


def verify_ms(tests: Iterable[Mapping[str, Any]], ks: Sequence[int], decode_tokens: int) -> dict[str, Any]:
    """llama-bench's JSON -> {"k_ms": {k: ms}, "pp_ms": {k: ms}, "decode_ms"}: medians of the samples; k = 1 is the
    decode step (tg / decode_tokens), pp_ms keeps the prompt test of every k (pp_ms[1]: one-token prompt forward)."""
    pp, tg = {}, None
    for t in tests:
        ms = statistics.median(t["samples_ns"]) / 1e6
        if t.get("n_prompt"):
            pp[int(t["n_prompt"])] = ms
        elif t.get("n_gen") == decode_tokens:
            tg = ms / decode_tokens
    missing = [k for k in ks if k not in pp and not (k == 1 and tg is not None)]
    if missing or tg is None:
        raise ValueError(f"llama-bench output lacks the tests k={missing} / tg{decode_tokens}")
    k_ms = {k: (tg if k == 1 else pp[k]) for k in ks}
    return {"k_ms": k_ms, "pp_ms": pp, "decode_ms": tg}


def verify_ms_means(runs: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """{k: mean ms} over several verify runs (their k_ms; JSON made the keys strings)."""
    acc: dict[int, list[float]] = {}
    for r in runs:
        for k, ms in (r.get("k_ms") or {}).items():
            acc.setdefault(int(k), []).append(ms)
    return {k: sum(v) / len(v) for k, v in sorted(acc.items())}


def batched_args(npp: int, ntg: int, max_npl: int) -> list[str]:
    """llama-batched-bench arguments (after -npl): a prompt of npp per sequence, ntg decode steps."""
    return ["-npp", str(npp), "-ntg", str(ntg), "-c", str(max_npl * (npp + ntg) + 256), "-b", "2048", "-ub", "512",
            "-ngl", "99", "-fa", "on", "--output-format", "jsonl"]


def parse_npl(text: str) -> list[int]:
    """``1-32`` or ``1,8,16,32`` -> sequence counts 1..512."""
    text = str(text).strip()
    if "-" in text and "," not in text:
        lo, hi = (int(x) for x in text.split("-", 1))
        out = list(range(lo, hi + 1))
    else:
        out = [int(x) for x in text.split(",") if x.strip()]
    if not out or min(out) < 1 or max(out) > 512 or len(set(out)) != len(out):
        raise ValueError(f"--npl {text!r}: give FIRST-LAST or distinct counts 1..512, e.g. 1-32 or 1,8,16,32")
    return out


def mean(xs: Iterable[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


# --- drafts and the projection ---------------------------------------------------------------------------------------

def step_ms(timings: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """llama-server timings of several completions -> ms per decode step, tokens drafted and accepted per step.
    A step yields 1 + the tokens accepted in it; the first token comes from the prompt."""
    ts = list(timings)
    predicted = sum(int(t.get("predicted_n", 0)) for t in ts)
    accepted = sum(int(t.get("draft_n_accepted", 0)) for t in ts)
    drafted = sum(int(t.get("draft_n", 0)) for t in ts)
    steps = sum(max(1, int(t.get("predicted_n", 0)) - int(t.get("draft_n_accepted", 0)) - 1) for t in ts)
    ms = sum(float(t.get("predicted_ms", 0.0)) for t in ts)
    return {"step_ms": ms / steps if steps else math.nan, "steps": steps, "tokens": predicted, "drafted": drafted,
            "accepted": accepted, "drafted_per_step": drafted / steps if steps else 0.0,
            "tokens_per_s": predicted / ms * 1000 if ms else math.nan}


def draft_cost(plain_step: float, draft_step: float, verify: Mapping[int, float], drafted_per_step: float) -> float | None:
    """The draft's own ms per step: the step with it minus the step without it, minus the extra verify cost of the
    tokens it proposed (verify(d + 1) - verify(1), d = drafted tokens per step, rounded); never below 0."""
    d = int(round(drafted_per_step))
    if d < 1 or (d + 1) not in verify or 1 not in verify:
        return None
    return max(0.0, (draft_step - plain_step) - (verify[d + 1] - verify[1]))


def projection(verify: Mapping[int, float], draft_ms: float | None, *, per_token: bool, max_draft: int,
               measured_draft: int, accept_lens: Sequence[float] = ACCEPT_LENS, k_ref: int = K_REF) -> list[dict]:
    """[{accept_len, k, plain_tps, projected_tps}] for every measured verify width k (k - 1 drafted tokens) the
    draft can propose; verify: {k: ms} of one build; draft_ms: its cost per step at measured_draft tokens."""
    if 1 not in verify:
        return []
    plain = 1000.0 / verify[1]
    rows = []
    for L in accept_lens:
        a = acceptance(L, k_ref)
        for k in sorted(verify):
            d = k - 1
            if d > max_draft or (d >= 1 and draft_ms is None):
                continue
            cost = 0.0 if d == 0 else (draft_ms / measured_draft * d if per_token else draft_ms)
            rows.append({"accept_len": L, "k": k, "plain_tps": round(plain, 2),
                         "projected_tps": round(expected_tokens(a, d) / (verify[k] + cost) * 1000.0, 2)})
    return rows


# --- the results file --------------------------------------------------------------------------------------------------

def weights_read(weights: Mapping[str, int], ks: Iterable[int]) -> list[dict]:
    """[{k, ratio}]: bytes a k-token forward reads / bytes a one-token forward reads (roofline.WeightsPerToken.read_ratio).
    weights: WeightsPerToken's fields, as gpu-multitoken's verify stage records them."""
    w = WeightsPerToken(**{f: int(weights.get(f) or 0) for f in ("total_bytes", "active_bytes", "expert_bytes",
                                                                 "experts_used", "experts")})
    return [{"k": k, "ratio": round(w.read_ratio(k), 3)} for k in ks]


ROLES = ("pin", "patched")  # the two builds every row compares


def parse_roles(text: str) -> dict[str, str]:
    """'pin=patched,patched=cand' -> {"pin": "patched", "patched": "cand"} (--report-as, --labels); '' -> {}."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        role, sep, value = part.partition("=")
        if not sep or role not in ROLES or not value:
            raise ValueError(f"{part!r}: give ROLE=VALUE with ROLE one of {', '.join(ROLES)} (pin=patched,patched=cand)")
        out[role] = value
    return out


def as_roles(columns: Mapping[str, Any], roles: Mapping[str, str]) -> dict[str, Any]:
    """A model's {column: data} with the builds named in roles renamed to their role, per dispatch (roles
    {"pin": "patched", "patched": "cand"}: patched@a100 -> pin@a100, cand@a100 -> patched@a100); without roles unchanged."""
    if not roles:
        return dict(columns)
    back = {build: role for role, build in roles.items()}
    out = {}
    for column, data in columns.items():
        build, _, disp = column.partition("@")
        if build in back:
            out[back[build] + ("@" + disp if disp else "")] = data
    return out


def merge_shapes(shapes: Mapping[str, Any] | None, run: Mapping[str, Any]) -> dict[str, Any]:
    """The shapes file with run's rows in place of the rows of the same files (model, layers, experts); the other rows
    stay. Each row keeps "started" and "gpu" of its run, and "runs" keeps every run's other fields (settings, commands,
    kernels, dispatch) under its start time, so the file says how each row was measured."""
    def key(r):
        return r["model"], r["layers"], r.get("experts")

    def fields(x):
        return {k: v for k, v in x.items() if k not in ("rows", "runs")}
    shapes = dict(shapes or {})
    runs = dict(shapes.get("runs") or ({shapes["started"]: fields(shapes)} if shapes.get("started") else {}))
    runs[run.get("started") or "unknown"] = fields(run)
    new = [dict(r, started=run.get("started"), gpu=run.get("gpu")) for r in run.get("rows") or []]
    keys = {key(r) for r in new}
    old = [r for r in shapes.get("rows") or [] if key(r) not in keys]
    return {**fields(run), "rows": old + new, "runs": runs}


def rows(models: Mapping[str, tuple], verify: Mapping, batched: Mapping, drafts: Mapping, *, projection_draft: str,
         accept_lens: Sequence[float] = ACCEPT_LENS, k_ref: int = K_REF, weights: Mapping[str, Mapping] | None = None,
         labels: Mapping[str, str] | None = None) -> list[dict]:
    """The JSON rows, one per (model file, dispatch). models: file key -> (model name, layers). Inputs are means over
    rounds: verify[file][column] = {k: ms}; batched[file][column] = {N: tok/s}; drafts[type][column] = {"own_ms",
    "drafted"} (drafted tokens per step); columns are lab/bench/dispatch.py names (pin, patched, pin@a100, ...).
    models[file] may add the routed expert count (name, layers, experts): the row gets "experts"; weights[file]
    (roofline fields) adds "weights_read" for the row's k; labels ({role: text}) what the build column says."""
    from lab.bench.dispatch import column_name

    dispatches = sorted({(c.split("@") + ["native"])[1] for src in (verify, batched) for m in src.values() for c in m},
                        key=lambda d: d != "native")
    info = DRAFTS[projection_draft]
    out = []
    for model, (name, layers, *rest) in models.items():
        for disp in dispatches:
            pin, ours = column_name("pin", disp), column_name("patched", disp)
            v, b = verify.get(model) or {}, batched.get(model) or {}
            if not any(src.get(c) for src in (v, b) for c in (pin, ours)):
                continue
            ks = sorted(set(v.get(pin, {})) | set(v.get(ours, {})))
            ns = sorted(set(b.get(pin, {})) | set(b.get(ours, {})))
            d = drafts.get(projection_draft) or {}
            own = {c: (d.get(c) or {}).get("own_ms") for c in (pin, ours)}
            row = {
                "model": name, "layers": layers, "dispatch": disp,
                "verify": [{"k": k, "pin_ms": _r(v.get(pin, {}).get(k)), "patched_ms": _r(v.get(ours, {}).get(k))} for k in ks],
                "batched": [{"sequences": n, "pin_tps": _r(b.get(pin, {}).get(n)), "patched_tps": _r(b.get(ours, {}).get(n))} for n in ns],
                "draft": {"type": projection_draft, "pin_ms": _r(own[pin]), "patched_ms": _r(own[ours])},
                "projection": projection(v.get(ours, {}), own[ours], per_token=info["per_token"], max_draft=info["max_draft"],
                                         measured_draft=max(1, int(round((d.get(ours) or {}).get("drafted") or info["max_draft"]))),
                                         accept_lens=accept_lens, k_ref=k_ref) if v.get(ours) else [],
            }
            if rest:
                row["experts"] = rest[0]
            if (weights or {}).get(model):
                row["weights_read"] = weights_read(weights[model], ks)
            if labels:
                row["labels"] = dict(labels)
            out.append(row)
    return out


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)


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
                "measured yet (python -m lab.runs.gpu_multitoken writes lab/results/gpu-multitoken.json).\n")
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
    """The generated section for the other shapes (a run of python -m lab.runs.gpu_multitoken over cut and real-expert files):
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
