"""The A100-dispatch re-verification (issue 41, lab/scripts/gpu-a100-check): what the script runs, and the parsers and
summaries that turn llama.cpp's output into lab/results/gpu-a100-dispatch.json, testable without a GPU.

* ops: test-backend-ops for every op. ``support`` mode lists every case (op name and parameters) in seconds; then one
  ``test -o OP`` process per op, FLASH_ATTN_EXT in parts by head size (``-p '^hsk=N,'``, the rest by a negative
  look-ahead), each with its own timeout, several at a time. Per op and part: cases, passed, failed, not supported,
  not run (cases that a timeout or a crash left unreported).
* soak: lab/bench/soak.py through the patched llama-server, prompt lengths 1..100 on six models, then -ub 1..16.
* sanitizer: compute-sanitizer memcheck and racecheck summaries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SUPPORT_LINE = re.compile(r"^\s+([^\s(]+)\((.*)\): (SUPPORTED|NOT SUPPORTED)\s*$")
SUMMARY = re.compile(r"(\d+)/(\d+) tests passed")
FA = "FLASH_ATTN_EXT"
# test-backend-ops's head sizes for FLASH_ATTN_EXT (make_test_cases_eval); the parts are cut by them
FA_HEAD_SIZES = (40, 64, 72, 80, 96, 128, 192, 256, 320, 512, 576)

# the six synthetic families of the crash sweep: tiny presets and the 4-layer real-shape V4, all in the UD mix
SOAK_MODELS = ("tiny-deepseek4", "tiny-glm-dsa", "tiny-deepseek32", "tiny-llama", "tiny-mamba", "deepseek-v4-flash-4l")
SOAK_LENGTHS = range(1, 101)
UB_RANGE = range(1, 17)
UB_LENGTHS = range(1, 41)


def clean(text: str) -> str:
    return ANSI.sub("", text or "")


def support_cases(text: str) -> dict[str, list[tuple[str, bool]]]:
    """``test-backend-ops support -b CUDA0`` output -> op name: [(parameters, supported)] in order."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for line in clean(text).splitlines():
        m = SUPPORT_LINE.match(line)
        if m:
            out.setdefault(m[1], []).append((m[2], m[3] == "SUPPORTED"))
    return out


def op_filter(op: str) -> str:
    """An ``-o`` entry that selects exactly ``op``: the name itself when it is a plain op name (test-backend-ops
    matches those exactly), else an anchored, escaped regex."""
    return op if re.fullmatch(r"[A-Z0-9_]+", op) else f"^{re.escape(op)}$"


def fa_parts(head_sizes: Sequence[int] = FA_HEAD_SIZES) -> dict[str, str]:
    """FLASH_ATTN_EXT's parts: name -> ``-p`` regex over the case parameters (``hsk=64,hsv=64,...``). Disjoint, and
    together every case: the last part takes every head size not listed."""
    parts = {f"hsk={h}": f"^hsk={h}," for h in head_sizes}
    parts["hsk=other"] = "^(?!hsk=(" + "|".join(map(str, head_sizes)) + "),)"
    return parts


def part_of(params: str, parts: dict[str, str]) -> str | None:
    """Which part a case's parameters fall in (Python's re reads these regexes as ECMAScript does)."""
    for name, rx in parts.items():
        if re.search(rx, params):
            return name
    return None


def jobs(cases: dict[str, list[tuple[str, bool]]], parts: dict[str, str] | None = None,
         only: Iterable[str] | None = None) -> list[dict]:
    """One test-backend-ops process per op, FLASH_ATTN_EXT one per part; the biggest first (they set the wall time).
    Each job: op, part (None), -o filter, -p regex (None), and the cases it should report (listed, supported)."""
    parts = parts if parts is not None else fa_parts()
    wanted = set(only) if only else None
    out = []
    for op, listed in cases.items():
        if wanted is not None and op not in wanted:
            continue
        if op == FA and parts:
            for name, rx in parts.items():
                mine = [(p, s) for p, s in listed if part_of(p, parts) == name]
                if mine:
                    out.append({"op": op, "part": name, "filter": op_filter(op), "params": rx, "cases": len(mine),
                                "supported": sum(s for _, s in mine)})
        else:
            out.append({"op": op, "part": None, "filter": op_filter(op), "params": None, "cases": len(listed),
                        "supported": sum(s for _, s in listed)})
    return sorted(out, key=lambda j: -j["supported"])


def count(text: str, rc: int | str | None, job: dict) -> dict:
    """One test mode process's output -> its counts. Works with -j N (lines interleave; each status is one printf):
    passed/failed from the summary line when it is there, else by counting OK/FAIL statuses (a timeout or a crash);
    not_run = supported cases that reported neither."""
    raw = text or ""
    txt = clean(raw)
    summary = SUMMARY.findall(txt)
    oks = raw.count("\x1b[1;32mOK\x1b[0m")
    fails = raw.count("\x1b[1;31mFAIL\x1b[0m")
    not_supported = len(re.findall(r"not supported", txt))
    if summary:
        passed, run = int(summary[-1][0]), int(summary[-1][1])
        failed = run - passed
    else:  # no summary: a timeout or a crash; the backend's closing OK/FAIL lines are not printed then either
        passed, failed = oks, fails
    if "Failing tests:" in txt:  # the closing list (test mode prints it after the summary): "  OP(params)" lines
        failing = []
        for ln in txt.split("Failing tests:", 1)[1].splitlines()[1:]:
            m = re.match(r"^  ([^\s(]+\(.*\))\s*$", ln)
            if not m:
                break
            failing.append(m[1])
    else:  # the case lines themselves ("  OP(params): ... FAIL")
        failing = [ln.strip().rsplit(": ", 1)[0] for ln in txt.splitlines() if ln.rstrip().endswith("FAIL") and "(" in ln]
    reported = passed + failed
    return {"op": job["op"], "part": job["part"], "cases": job["cases"], "supported": job["supported"], "passed": passed,
            "failed": failed, "not_supported": max(not_supported, job["cases"] - job["supported"]),
            "not_run": max(0, job["supported"] - reported), "finished": bool(summary), "rc": rc,
            "failed_tests": failing[:20]}


def totals(rows: Iterable[dict]) -> dict:
    """Sum of counts over rows (parts of one op, or every op of one build)."""
    keys = ("cases", "supported", "passed", "failed", "not_supported", "not_run")
    rows = list(rows)
    out = {k: sum(r.get(k) or 0 for r in rows) for k in keys}
    out["unfinished"] = [f"{r['op']}{'[' + r['part'] + ']' if r.get('part') else ''}" for r in rows if not r.get("finished")]
    out["failing_ops"] = sorted({r["op"] for r in rows if r.get("failed")})
    return out


def by_op(rows: Iterable[dict]) -> dict[str, dict]:
    """Rows grouped by op: {op: totals (+ parts when the op ran in parts)}."""
    ops: dict[str, list[dict]] = {}
    for r in rows:
        ops.setdefault(r["op"], []).append(r)
    out = {}
    for op, rs in sorted(ops.items()):
        t = totals(rs)
        t["failed_tests"] = [x for r in rs for x in r.get("failed_tests", [])][:20]
        t["seconds"] = round(sum(r.get("seconds") or 0 for r in rs), 1)
        if any(r.get("part") for r in rs):
            t["parts"] = {r["part"]: {k: r.get(k) for k in ("cases", "passed", "failed", "not_supported", "not_run",
                                                             "finished", "rc", "seconds")} for r in rs}
        out[op] = t
    return out


def memcheck_summary(text: str) -> dict:
    """compute-sanitizer's closing line: ERROR SUMMARY (memcheck) or RACECHECK SUMMARY (racecheck)."""
    txt = clean(text)
    err = re.search(r"ERROR SUMMARY: (\d+) error", txt)
    race = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", txt)
    out: dict = {"errors": int(err[1]) if err else None}
    if race:
        out.update(hazards=int(race[1]), errors=int(race[2]), warnings=int(race[3]))
    out["finished"] = bool(err or race)
    out["first_errors"] = [ln.strip() for ln in txt.splitlines() if re.match(r"=+\s+(Invalid|Error|Race|Warning)", ln.strip())][:10]
    return out


def soak_verdict(cases: Sequence[dict]) -> dict:
    """The crash sweep's totals: requests, HTTP errors, crashes, and the cases that had any."""
    return {"cases": len(cases), "requests": sum(c.get("requests", 0) for c in cases),
            "http_errors": sum(c.get("http_errors", 0) for c in cases), "crashes": sum(c.get("crashes", 0) for c in cases),
            "failed_cases": [c.get("label") for c in cases if c.get("crashes") or c.get("http_errors") or c.get("error")]}


def text_summary(result: dict) -> str:
    """A few lines per part for a terminal and gpu-a100-dispatch.txt."""
    lines = [f"gpu-a100-check  dispatch {result.get('dispatch')}  {result.get('gpu', '')}"]
    for build, b in ((result.get("ops") or {}).get("builds") or {}).items():
        t = b.get("totals", {})
        lines.append(f"[ops] {build}: cc {b.get('reported_capability')}, {t.get('passed')}/{t.get('supported')} passed, "
                     f"{t.get('failed')} failed, {t.get('not_supported')} not supported, {t.get('not_run')} not run"
                     + (f"; unfinished {', '.join(t['unfinished'])}" if t.get("unfinished") else "")
                     + (f"; failing {', '.join(t['failing_ops'])}" if t.get("failing_ops") else ""))
    s = result.get("soak")
    if s:
        v = s.get("verdict", {})
        lines.append(f"[soak] {v.get('cases')} cases, {v.get('requests')} requests, {v.get('http_errors')} HTTP errors, "
                     f"{v.get('crashes')} crashes" + (f"; failed {v['failed_cases']}" if v.get("failed_cases") else ""))
    t = result.get("tokens")
    if t:
        lines.append(f"[tokens] all equal to the pin of their dispatch: {t.get('all_equal')}")
        for k, v in (t.get("summary") or {}).items():
            lines.append(f"    {k}: " + ", ".join(f"{a}={b}" for a, b in v.items()))
    for name, r in ((result.get("sanitizer") or {}).get("runs") or {}).items():
        lines.append(f"[sanitizer] {name}: " + ", ".join(f"{k}={r.get(k)}" for k in ("errors", "hazards", "warnings", "finished", "rc", "seconds")))
    for part, p in (result.get("parts") or {}).items():
        if not p.get("ok"):
            lines.append(f"[{part}] FAILED: {p.get('error')}")
    return "\n".join(lines) + "\n"
