"""The reliability suite's full run, and docs/reliability.md rendered from its results.

    python -m lab.tools.reliability run               # every section against real processes -> lab/results/reliability.json
    python -m lab.tools.reliability render [--check]  # lab/results/reliability.json -> docs/reliability.md (--check: current?)

Run it from the venv the package is installed in, as root for the tmpfs cases (disk full,
read-only): where mounting is impossible those cases say so instead of passing. The cases
themselves live in tests/probe.py; tests/test_reliability.py runs them at a smaller size (CI).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from lab.bench.jsonrows import dumps
from lab.bench.native_view import use_installed_build

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "lab" / "results" / "reliability.json"
DOC = REPO / "docs" / "reliability.md"
COMMAND = "python -m lab.tools.reliability run"


def _clean(value, root: str):
    """Temporary paths out of the results: the report must not change with mkdtemp's names."""
    if isinstance(value, str):
        value = value.replace(root, "TMP")
        return re.sub(r"/tmp/pyllm-tmpfs-\w+", "TMPFS", value)
    if isinstance(value, list):
        return [_clean(v, root) for v in value]
    if isinstance(value, dict):
        return {k: _clean(v, root) for k, v in value.items()}
    return value


def _probe():
    """tests/probe.py, the suite's cases (tests/ is no package): loaded from its file, as ``probe``."""
    spec = importlib.util.spec_from_file_location("probe", REPO / "tests" / "probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run(args: argparse.Namespace) -> int:
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:  # started in the background: the Ctrl-C cases need it (as conftest)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    use_installed_build()  # the checkout's pyllm_a100 (python -m from the root) runs the installed package's llama.cpp
    if Path.cwd() == REPO:
        os.chdir(tempfile.gettempdir())  # the children (pyllm, python -c) import the installed package
    probe = _probe()
    from pyllm_a100 import build_info
    from pyllm_a100.synth import synthesize

    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="pyllm-reliability-"))
    ws = probe.make_workspace(root / "ws")
    model = ws.model
    results: dict = {"command": COMMAND, "finished": None, "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                                                                      "loadavg_at_start": round(os.getloadavg()[0], 1)},
                     "build": {k: build_info().get(k) for k in ("llama_cpp_commit", "cuda", "cuda_version")}, "sections": {}}
    sections = results["sections"]

    def section(name: str, fn):
        t = time.monotonic()
        print(f"== {name}", flush=True)
        sections[name] = {"rows": fn(), "seconds": round(time.monotonic() - t, 1)}

    home = lambda tag: root / f"home-{tag}"  # noqa: E731 - a fresh PYLLM_HOME per probe
    section("bad_inputs", lambda: probe.bad_inputs(ws, root / "bad"))
    section("http", lambda: probe.http_bad_inputs(model, home("http")))
    section("load", lambda: probe.load(model, home("load"), clients=args.clients, waves=args.waves))
    glm = synthesize("tiny-glm-dsa", root / "hub" / "Tiny-GLM-UD-Q8_K_XL.gguf", split_max_size="13M", seed=5)
    shard_files = {f"UD-Q8_K_XL/{p.name}": p.read_bytes() for p in glm.paths}
    section("faults", lambda: {
        "kill_llama_server": probe.kill_llama_server(model, home("kill"), restart=3),
        "restart_zero": probe.kill_with_restart_zero(model, home("zero")),
        "kill_supervisor": probe.kill_supervisor(model, home("sup")),
        "foreground": [probe.foreground_signal(model, home(f"fg-{s.name}"), s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)],
        "corrupt_state": probe.corrupt_state(home("corrupt")),
        "disk_full_synth": probe.disk_full_synth(),
        "disk_full_fetch": probe.disk_full_fetch(shard_files, home("full-fetch")),
        "dropped_connection": [probe.dropped_connection(shard_files, home(f"cut-{p}"), persistent=p) for p in (False, True)],
    })
    section("security", lambda: {
        "key_required": probe.key_required(model, home("key")),
        "file_modes": probe.file_modes(model, home("modes")),
        "cors": probe.cors(model, home("cors")),
        "stop_strangers": probe.stop_never_signals_strangers(home("strangers")),
    })
    results["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["seconds"] = round(time.monotonic() - started)
    results = _clean(results, str(root))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(dumps(results))
    print(f"wrote {RESULTS} in {results['seconds']} s")
    DOC.write_text(render(results))
    print(f"wrote {DOC}")
    return 0


# --- rendering ---------------------------------------------------------------------------------


def _cell(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _left(row: dict) -> str:
    parts = []
    if row.get("left_behind"):
        parts.append("files: " + ", ".join(row["left_behind"]))
    if row.get("processes_left"):
        parts.append(f"{row['processes_left']} process(es)")
    return "; ".join(parts) or "nothing"


def render(r: dict) -> str:
    s = r["sections"]
    bad = s["bad_inputs"]["rows"]
    ran = [x for x in bad if not x.get("skipped")]
    ok = [x for x in ran if x.get("ok")]
    groups = sorted({x["group"] for x in bad}, key=[x["group"] for x in bad].index)
    load = r["machine"].get("loadavg_at_start", "?")
    busy = isinstance(load, (int, float)) and load >= 1.0
    shared = ": other work shared the cores, which shows in the load figures' latencies" if busy else ""
    out = [f"""# Reliability and security

<!-- generated by `python -m lab.tools.reliability render` from lab/results/reliability.json; do not edit -->
Measured with `{r['command']}` ({r['finished']}, {r['seconds']} s) on {r['machine']['cpus']} CPU cores
({r['machine']['processor']}; 1-minute load average {load} at the start{shared}), llama.cpp {r['build']['llama_cpp_commit']} ({'CUDA' if r['build']['cuda'] else 'CPU build'}),
synthetic `tiny-deepseek4` (seed 42) unless said otherwise. Every case runs real `pyllm` commands,
real llama-server processes, a loopback hub and real HTTP clients; `pytest tests/test_reliability.py`
runs the same cases at a smaller size (the part CI runs). Reproduce: `{COMMAND}`, then
`python -m lab.tools.reliability render`.

## Bad inputs

{len(ok)}/{len(ran)} cases give exactly one line with a non-zero exit (or 0 where nothing is wrong),
no traceback, and leave no model file, state entry or process behind{f"; {len(bad) - len(ran)} skipped" if len(bad) > len(ran) else ""}.
Groups: {', '.join(f"{g} ({sum(1 for x in bad if x['group'] == g)})" for g in groups)}.

| group | case | command | exit | the one line | left behind |
| --- | --- | --- | --- | --- | --- |"""]
    for x in bad:
        if x.get("skipped"):
            out.append(f"| {x['group']} | {_cell(x['case'])} | `{_cell(x['command'])}` | - | skipped: {_cell(x['skipped'])} | - |")
            continue
        mark = "" if x.get("ok") else " **(FAILS)**"
        out.append(f"| {x['group']} | {_cell(x['case'])}{mark} | `{_cell(x['command'])}` | {x['rc']} | {_cell(x['line'])} | {_cell(_left(x))} |")

    h = s["http"]["rows"]
    out.append(f"""
## HTTP bad inputs

Against one managed server (`pyllm serve m.gguf --ctx-size 1024 --detach`); after each request
`/health` is asked again and the supervisor's restart count read from state.json.
{sum(1 for x in h if x['health'] and x['restarts'] == 0 and x['same_pid'])}/{len(h)} left the server healthy, with 0 restarts and the same llama-server process.

| request | answer | seconds | `/health` after | restarts | same process |
| --- | --- | --- | --- | --- | --- |""")
    for x in h:
        out.append(f"| {_cell(x['case'])} | {_cell(x['answer'])} | {x['seconds']} | {'200' if x['health'] else 'DOWN'} | {x['restarts']} | {'yes' if x['same_pid'] else 'no'} |")

    ld = s["load"]["rows"]
    out.append(f"""
## Load

{ld['clients']} concurrent streaming chat clients (`openai` package, `max_tokens` {ld['max_tokens']}) x {ld['waves']} waves
against `pyllm serve` with llama-server's default slots.

| requests | failures | TTFT p50 | TTFT p99 | aggregate tokens/s | restarts |
| --- | --- | --- | --- | --- | --- |
| {ld['requests']} | {ld['failures']} | {ld['ttft_p50_s']} s | {ld['ttft_p99_s']} s | {ld['aggregate_tokens_per_s']} | {ld['restarts']} |
""")
    f = s["faults"]["rows"]
    k = f["kill_llama_server"]
    z = f["restart_zero"]
    sup = f["kill_supervisor"]
    out.append(f"""## Faults

| fault | what happened |
| --- | --- |
| kill -9 of llama-server, `--restart {k['restart_limit']}` | restarted {k['restarts']} times, back and healthy after {', '.join(f'{t} s' for t in k['restart_seconds'])}; the next kill: `{k['after_limit']}`, still listed by `pyllm ps` ({'yes' if k['listed_after_failure'] else 'NO'}) with the reason "{_cell(k['reason'])}"; `pyllm logs` exit {k['logs_rc']}; events.log holds {k['events_deaths']} deaths; `pyllm stop NAME` removes the entry ({'yes' if k['stop_removes_it'] else 'NO'}) |
| kill -9 of llama-server, `--restart 0` | status `{z['status']}`, events.log records the death ({'yes' if z['events_record_death'] else 'NO'}), `pyllm ps` lists {z['listed']}, `pyllm logs` exit {z['logs_rc']} |
| kill -9 of the detached supervisor | llama-server gone ({'yes' if sup['llama_server_gone'] else 'NO'}) within {sup['seconds']} s; `pyllm ps`: "{_cell(sup['ps_line'])}" |""")
    for fg in f["foreground"]:
        out.append(f"| {fg['signal']} to a foreground `pyllm serve` | exit {fg['rc']} in {fg['seconds']} s; llama-server left running: {fg['children_left']}; state.json left: {'yes (stale; the next `pyllm ps` removes it)' if fg['state_left'] else 'no'} |")
    for c in f["corrupt_state"]:
        out.append(f"| state.json is {c['state']} | `pyllm ps` exit {c['ps_rc']}: \"{_cell(c['ps_line'])}\"; `pyllm stop --all` exit {c['stop_all_rc']}; traceback: {'YES' if c['traceback'] else 'no'} |")
    for label, d in (("synth", f["disk_full_synth"]), ("fetch", f["disk_full_fetch"])):
        if d.get("skipped"):
            out.append(f"| disk full during {label} | skipped: {_cell(d['skipped'])} |")
        elif label == "synth":
            out.append(f"| disk full during synth (tmpfs filled by another writer after the space check) | exit {d['rc']}: \"{_cell(d['line'])}\"; left behind: {', '.join(d['left_behind']) or 'nothing'} |")
        else:
            out.append(f"| disk full during fetch (20 MiB tmpfs, hub lists sizes that fit) | exit {d['rc']}: \"{_cell(d['line'])}\"; whole files under their final names: {len(d['files_under_final_names'])} (intact: {'yes' if d['intact'] else 'NO'}); manifest written: {'YES' if d['manifest'] else 'no'} |")
    for d in f["dropped_connection"]:
        said = f': "{_cell(d["line"])}"' if d["rc"] else ""
        out.append(f"| loopback hub drops the connection mid-file ({d['cut']}) | exit {d['rc']}{said}; whole files: {d['complete_files']} (all intact: {'yes' if d['all_complete_files_intact'] else 'NO'}); manifest: {'yes' if d['manifest'] else 'no'} |")

    sec = s["security"]["rows"]
    kr = sec["key_required"]
    out.append("""
## Security

| check | result |
| --- | --- |""")
    for label in ("key empty", "key spaces", "key newline"):
        v = kr[label]
        out.append(f"| `--host 0.0.0.0 --api-key` {label.split()[1]} | exit {v['rc']}: \"{_cell(v['line'])}\"; state left: {'YES' if v['state_left'] else 'no'} |")
    out.append("| `--host 0.0.0.0`, no key given (one is generated) | " + ", ".join(f"{a}: HTTP {c}" for a, c in kr["requests"].items()) + " |")
    out.append(f"| the generated key in argv, logs, state, events, request | {'found in ' + ', '.join(kr['key_found_in']) if kr['key_found_in'] else 'nowhere'} (key file mode {kr['key_file_mode']}) |")
    out.append("| file modes of a detached server's state | " + ", ".join(f"`{p}` {m}" for p, m in sec["file_modes"].items()) + " |")
    for c in sec["cors"]:
        out.append(f"| CORS, bind {c['bind']} (users are told {c['told']}) | " + "; ".join(
            f"{o}: {'allowed' if c['allowed'][o] else 'blocked'} (`{a or 'no header'}`)" for o, a in c["allow_origin"].items()) + " |")
    for st in sec["stop_strangers"]:
        out.append(f"| `pyllm stop --all` with state.json naming an unrelated process ({st['forged']}) | exit {st['stop_rc']}: \"{_cell(st['line'])}\"; the process still runs: {'yes' if st['process_alive'] else 'NO'} |")
    out.append("""
CORS: llama-server sends one `Access-Control-Allow-Origin` value as given (a comma-separated list
is not valid CORS), so there is one rule per bind: a loopback bind reflects loopback origins (its
`localhost` mode), any other bind allows the address users are told to use (`http://HOSTNAME:PORT`
for `0.0.0.0`). Pages served by the server itself are same-origin and need no CORS header.
""")
    return "\n".join(out)


def render_cmd(args: argparse.Namespace) -> int:
    results = json.loads(Path(args.results).read_text())
    text = render(results)
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is not the rendering of {args.results}: run python -m lab.tools.reliability render", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="run every section (minutes) and render")
    p_run.add_argument("--clients", type=int, default=32)
    p_run.add_argument("--waves", type=int, default=3)
    p_render = sub.add_parser("render", help="render docs/reliability.md from the results")
    p_render.add_argument("--results", default=str(RESULTS))
    p_render.add_argument("--check", action="store_true", help="exit 1 when docs/reliability.md is not current")
    args = parser.parse_args()
    return run(args) if args.cmd == "run" else render_cmd(args)


if __name__ == "__main__":
    sys.exit(main())
