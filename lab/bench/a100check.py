"""The A100-dispatch re-verification (issue 41, python -m lab.runs.gpu_a100_check): what the script runs, and the parsers and
summaries that turn llama.cpp's output into lab/results/gpu-a100-dispatch.json, testable without a GPU.

* ops: test-backend-ops for every test. ``support`` mode lists the cases in seconds but leaves out the fusion cases
  (``run_whole_graph``; seen on the CPU build: ADD 141 listed of 154 run, DSV4_HC_CHAIN none), and ``-o`` takes a
  regex only when it holds no "(" (an entry with one is a whole case string), so no look-ahead can say "every other
  name". The tests are therefore cut by the first letter of their name (``-o '^M'``; F without FLASH_ATTN_EXT by a
  parenthesis-free alternation), every name falls in exactly one letter, and FLASH_ATTN_EXT runs in parts by head
  size (``-p '^hsk=N,'``, the rest by a negative look-ahead: -p is a plain regex). A letter's process runs with one
  worker, so its case lines are whole and are counted per test name. Each process has its own timeout, several run
  at a time. Per test name (and FLASH_ATTN_EXT part): cases, passed, failed, not supported, not run (listed
  supported cases that a timeout or a crash left unreported: a lower bound for the fusion cases nothing lists).
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


def all_but(word: str, prefix: str) -> str:
    """A regex with neither "(" nor "," (test-backend-ops's -o reads "(" as a case string and splits at ",") matching
    every name that starts with ``prefix`` (a prefix of ``word``) except ``word``: names that part from it after the
    prefix, run on past it, or stop short of it."""
    k, esc = len(prefix), re.escape
    alts = [f"^{esc(word[:i])}[^{esc(word[i])}]" for i in range(k, len(word))]
    return "|".join(alts + [f"^{esc(word)}.", *(f"^{esc(word[:i])}$" for i in range(max(k, 1), len(word)))])


def name_groups(weights: dict[str, int], max_cases: int = 1500, apart: str = FA) -> dict[str, str]:
    """``-o`` regexes that together take every test name exactly once, FLASH_ATTN_EXT (``apart``, run in parts) not:
    split by first letter, then a group with more than ``max_cases`` listed cases by its next character, and so on
    (MUL_MAT's family goes to MUL_MAT_I..., MUL_MAT_V..., ...). ``weights``: listed cases per name. Returns
    {label: regex}; a group's regex is ``^PREFIX``, or the "all but" form where FLASH_ATTN_EXT shares the prefix."""
    names = sorted(set(weights) | {apart})
    out: dict[str, str] = {}

    def whole(prefix: str) -> str:
        return all_but(apart, prefix) if apart.startswith(prefix) else f"^{re.escape(prefix)}"

    def split(prefix: str, group: list[str]) -> None:
        weight = sum(weights.get(n, 0) for n in group)
        longer = [n for n in group if len(n) > len(prefix)]
        if prefix and (weight <= max_cases or not longer) and group != [apart]:
            out[f"{prefix}*"] = whole(prefix)
            return
        children = sorted({n[len(prefix)] for n in longer})
        for c in children:
            sub = [n for n in longer if n[len(prefix)] == c]
            if sub != [apart]:
                split(prefix + c, sub)
            elif not apart.startswith(prefix + c) or len(apart) > len(prefix) + 1:
                pass
        if apart in group and apart != prefix:  # names that part from FLASH_ATTN_EXT inside a child cut at its letter
            for c in children:
                sub = [n for n in longer if n[len(prefix)] == c]
                if sub == [apart] and len(apart) > len(prefix) + 1:
                    out[f"{prefix + c}* but {apart}"] = all_but(apart, prefix + c)
        esc = re.escape(prefix)
        rest = [f"^{esc}[^{''.join(re.escape(c) for c in children)}]"] if children else [f"^{esc}."]
        if prefix and prefix != apart:
            rest.append(f"^{esc}$")
        elif not prefix:
            rest.append("^$")
        out[f"{prefix} other"] = "|".join(rest)

    split("", names)
    return pack(out, weights, max_cases)


def pack(groups: dict[str, str], weights: dict[str, int], capacity: int) -> dict[str, str]:
    """Groups joined (regex alternation: still no "(" or ",") into as few processes as keep each under ``capacity``
    listed cases, biggest first; empty groups ride along with the others (a process costs a CUDA start)."""
    sized = sorted(((sum(w for n, w in weights.items() if re.search(rx, n)), label, rx) for label, rx in groups.items()),
                   key=lambda g: (-g[0], g[1]))
    bins: list[list] = []
    for size, label, rx in sized:
        fit = next((b for b in bins if b[0] + size <= capacity), None)
        if fit is None:
            bins.append([size, [label], [rx]])
        else:
            fit[0] += size
            fit[1].append(label)
            fit[2].append(rx)
    return {" + ".join(labels)[:120]: "|".join(rxs) for _, labels, rxs in bins}


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
    """The processes: one per name group (``name_groups``) and one per FLASH_ATTN_EXT part, the biggest first
    (they set the wall time); with ``only``, one per named op instead (exact names). Each job: op (None for a letter:
    its names come from its output), part, -o filter, -p regex (None), and what support mode listed for it."""
    parts = fa_parts() if parts is None else parts
    out = []
    if only:
        for op in only:
            listed = cases.get(op, [])
            if op == FA and parts:
                out += [dict(j, op=FA) for j in _fa_jobs(listed, parts)]
            else:
                out.append({"op": None, "part": op, "filter": op if re.fullmatch(r"[A-Z0-9_]+", op) else f"^{re.escape(op)}$",
                            "params": None, "listed": {op: _listed(listed)}, "supported": sum(s for _, s in listed)})
    else:
        for name, rx in name_groups({op: len(v) for op, v in cases.items() if op != FA}).items():
            listed = {op: _listed(v) for op, v in cases.items() if op != FA and re.search(rx, op)}
            out.append({"op": None, "part": name, "filter": rx, "params": None, "listed": listed,
                        "supported": sum(v[1] for v in listed.values())})
        if FA in cases:
            out += _fa_jobs(cases[FA], parts) if parts else [{"op": FA, "part": None, "filter": FA, "params": None,
                                                             "cases": len(cases[FA]), "supported": sum(s for _, s in cases[FA])}]
    return sorted(out, key=lambda j: -j["supported"])


def _listed(cases: list[tuple[str, bool]]) -> tuple[int, int]:
    return len(cases), sum(s for _, s in cases)


def _fa_jobs(listed: list[tuple[str, bool]], parts: dict[str, str]) -> list[dict]:
    out = []
    for name, rx in parts.items():
        mine = [(p, s) for p, s in listed if part_of(p, parts) == name]
        if mine:
            out.append({"op": FA, "part": name, "filter": FA, "params": rx, "cases": len(mine),
                        "supported": sum(s for _, s in mine)})
    return out


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
    not_supported = max(not_supported, job["cases"] - job["supported"])
    return {"op": job["op"], "part": job["part"], "cases": max(job["cases"], reported + not_supported),
            "supported": max(job["supported"], reported), "passed": passed, "failed": failed,
            "not_supported": not_supported, "not_run": max(0, job["supported"] - reported), "finished": bool(summary),
            "rc": rc, "failed_tests": failing[:20]}


CASE_LINE = re.compile(r"^\s+([^\s(]+)\((.*)\): (.*)$")


def split_names(stdout: str, rc: int | str | None, job: dict) -> list[dict]:
    """A letter's process (one worker: whole lines) -> a row per test name from its case lines, with what support mode
    listed for that name (the fusion cases are not listed: a name's cases are what ran, or what was listed if more).
    A run cut short leaves its listed, unreported cases as not_run; a name all of whose listed cases reported counts as
    finished (its fusion cases, if any came later, are unknown), the others as unfinished."""
    names: dict[str, dict] = {}
    for line in clean(stdout).splitlines():
        m = CASE_LINE.match(line)
        if not m:
            continue
        r = names.setdefault(m[1], {"passed": 0, "failed": 0, "not_supported": 0, "failed_tests": []})
        status = m[3].strip()
        if status.endswith("OK"):
            r["passed"] += 1
        elif status.endswith("FAIL"):
            r["failed"] += 1
            r["failed_tests"].append(f"{m[1]}({m[2]})")
        elif status.startswith("not supported") or status.startswith("skipping"):
            r["not_supported"] += 1
    finished = bool(SUMMARY.search(clean(stdout)))
    rows = []
    for name in sorted(set(names) | set(job.get("listed") or {})):
        r = names.get(name, {"passed": 0, "failed": 0, "not_supported": 0, "failed_tests": []})
        n_listed, supported_listed = (job.get("listed") or {}).get(name, (0, 0))
        reported = r["passed"] + r["failed"]
        done = finished or (n_listed > 0 and reported + r["not_supported"] >= n_listed)  # every listed case reported
        rows.append({"op": name, "part": None, "cases": max(n_listed, reported + r["not_supported"]),
                     "supported": max(supported_listed, reported), "passed": r["passed"], "failed": r["failed"],
                     "not_supported": r["not_supported"], "not_run": 0 if done else max(0, supported_listed - reported),
                     "finished": done, "rc": rc, "failed_tests": r["failed_tests"][:20], "group": job["part"]})
    if not finished and not rows:
        rows.append({"op": f"({job['part']})", "part": None, "cases": 0, "supported": 0, "passed": 0, "failed": 0,
                     "not_supported": 0, "not_run": 0, "finished": False, "rc": rc, "failed_tests": [], "group": job["part"]})
    return rows


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
        groups = sorted({r["group"] for r in rs if r.get("group")})
        if groups:  # its process ran the whole group: the group's seconds, not the name's
            t["group"], t["group_seconds"] = " | ".join(groups), max(r.get("process_seconds") or 0 for r in rs)
        if any(r.get("part") for r in rs):
            t["seconds"] = round(sum(r.get("process_seconds") or 0 for r in rs), 1)
            t["parts"] = {r["part"]: {k: r.get(k) for k in ("cases", "passed", "failed", "not_supported", "not_run",
                                                             "finished", "rc", "process_seconds")} for r in rs}
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
