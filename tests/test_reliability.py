"""The reliability probe's fast part (tests/probe.py at CI size) and one test per item it fixed.

Real processes throughout: `pyllm` commands, detached supervisors, llama-server, the loopback
hub, tmpfs mounts (skipped, with the reason, where mounting is impossible).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

import probe
from conftest import PYLLM, REPO, run_pyllm

# --- the catalogue of bad inputs (>= 40 cases over every command) -----------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, tiny_deepseek4: Path) -> probe.Workspace:
    return probe.make_workspace(tmp_path_factory.mktemp("ws"), model=tiny_deepseek4)


CASES = probe.bad_input_cases()


def test_the_catalogue_covers_every_command() -> None:
    groups = {c.group for c in CASES}
    assert len(CASES) >= 40
    assert groups >= {"build-info", "synth", "fetch", "serve", "generate", "ps/stop/logs", "rpc-worker", "doctor"}


@pytest.mark.parametrize("case", CASES, ids=[f"{c.group}: {c.name}" for c in CASES])
def test_bad_input_is_one_line_and_leaves_nothing(case: probe.Case, workspace: probe.Workspace, tmp_path: Path) -> None:
    row = probe.run_bad_input(case, workspace, tmp_path)
    if row.get("skipped"):
        pytest.skip(row["skipped"])
    assert not row["traceback"], row
    assert row["rc"] == case.rc, row
    assert case.expect in row["line"], row
    assert row["stderr_lines"] <= 1 + (case.rc == 0), row
    assert row["processes_left"] == 0, row
    assert not [f for f in row["left_behind"] if f.endswith(".gguf") or "state.json" in f], row
    assert row["ok"], row


# --- item 1: no empty key off loopback; a generated key is enforced --------------------------------------


def test_blank_keys_are_refused_and_the_generated_key_is_enforced(tiny_deepseek4: Path, tmp_path: Path) -> None:
    row = probe.key_required(tiny_deepseek4, tmp_path / "home")
    for label in ("key empty", "key spaces", "key newline"):
        assert row[label]["rc"] == probe.EX_CONFIG and "--api-key is empty" in row[label]["line"] and not row[label]["state_left"], row
    assert row["requests"] == {"no key": 401, "wrong key": 401, "empty bearer": 401, "bearer of spaces": 401, "the key": 200}
    assert row["key_found_in"] == [] and row["key_file_mode"] == "0o600"


def test_library_refuses_blank_keys_and_keyless_key_files(tiny_deepseek4: Path, tmp_path: Path) -> None:
    from pyllm_a100 import Server
    from pyllm_a100.errors import ServerConfigError

    with pytest.raises(ServerConfigError, match="empty or only spaces"):
        Server(tiny_deepseek4, host="0.0.0.0", port=0, api_key=" \t")
    blank = tmp_path / "keys"
    blank.write_text("\n# a comment\n\n")
    with pytest.raises(ServerConfigError, match="has no usable key"):
        Server(tiny_deepseek4, host="0.0.0.0", port=0, api_key_file=str(blank))


# --- item 2: stop signals only our own processes ------------------------------------------------------------


def test_stop_never_signals_a_process_that_is_not_ours(tmp_path: Path) -> None:
    rows = probe.stop_never_signals_strangers(tmp_path / "home")
    assert [r["process_alive"] for r in rows] == [True, True], rows
    assert all(r["stop_rc"] == 0 and "removed stale entry forged" in r["line"] for r in rows), rows


# --- item 3: CORS for each bind address -------------------------------------------------------------------


def test_cors_allows_the_address_users_are_told_and_no_foreign_page(tiny_deepseek4: Path, tmp_path: Path) -> None:
    import socket

    rows = {row["bind"]: row for row in probe.cors(tiny_deepseek4, tmp_path)}
    for row in rows.values():
        assert row["allowed"]["the URL users are told"] and not row["allowed"]["a foreign page"], row
    for loopback in ("127.0.0.1", "localhost"):
        assert rows[loopback]["allowed"]["http://127.0.0.1:PORT"] and rows[loopback]["allowed"]["http://localhost:PORT"]
    wildcard = rows["0.0.0.0"]
    assert wildcard["told"] == f"http://{socket.gethostname()}:{wildcard['told'].rsplit(':', 1)[1]}"
    assert wildcard["allow_origin"]["a foreign page"] == wildcard["told"], "never http://0.0.0.0:PORT"


# --- item 4: a private state tree ----------------------------------------------------------------------------


def test_state_tree_is_0700_and_its_files_0600(tiny_deepseek4: Path, tmp_path: Path) -> None:
    modes = probe.file_modes(tiny_deepseek4, tmp_path / "fresh-home")
    assert {p: m for p, m in modes.items() if p.endswith("/") or p == "PYLLM_HOME"} == {
        "PYLLM_HOME": "0o700", "servers/": "0o700", "servers/modes/": "0o700"}, modes
    files = {p: m for p, m in modes.items() if not p.endswith("/") and p != "PYLLM_HOME"}
    assert {"servers/modes/state.json", "servers/modes/server.log", "servers/modes/events.log",
            "servers/modes/supervisor.log", "servers/modes/request.json"} <= set(files), modes
    assert set(files.values()) == {"0o600"}, modes


# --- item 5: --detach with relative paths ------------------------------------------------------------------------


def test_detach_resolves_relative_model_and_extra_paths(tiny_deepseek4: Path, tmp_path: Path, pyllm_home: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.gguf").symlink_to(tiny_deepseek4)
    (work / "slots").mkdir()
    (work / "tmpl.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    result = subprocess.run([str(PYLLM), "serve", "m.gguf", "--port", "0", "--detach", "--name", "rel", "--",
                             "--chat-template-file", "tmpl.jinja", "--slot-save-path", "slots"],
                            cwd=work, capture_output=True, text=True, timeout=300)
    try:
        assert result.returncode == 0, result.stderr
        request = json.loads((pyllm_home / "servers" / "rel" / "request.json").read_text())
        assert request["model"] == str(tiny_deepseek4.resolve())
        assert request["extra_args"] == ["--chat-template-file", str(work / "tmpl.jinja"), "--slot-save-path", str(work / "slots")]
        port = json.loads((pyllm_home / "servers" / "rel" / "state.json").read_text())["port"]
        reply = httpx.post(f"http://127.0.0.1:{port}/apply-template", json={"messages": [{"role": "user", "content": "XYZ"}]}, timeout=60)
        assert reply.json()["prompt"] == "XYZ", "the relative template file must have been found by the detached server"
    finally:
        run_pyllm("stop", "rel")


def test_the_printed_curl_line_works_as_pasted(tiny_deepseek4: Path, tmp_path: Path) -> None:
    """The ready message's curl line run by bash as printed: an alias with quotes, a PYLLM_HOME with a space and a quote,
    an API key read from its file (the line broke on the alias's quote and on spaces in the key file's path)."""
    home = tmp_path / "pyllm home's"
    env = {"PYLLM_HOME": str(home)}
    result = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--detach", "--name", "quoted", "--alias", "it's \"v4\" $x",
                       "--api-key", "k3y-1", env=env, timeout=300)
    try:
        assert result.returncode == 0, result.stderr
        (curl,) = [line for line in result.stdout.splitlines() if line.startswith("  curl ")]
        assert "cat " in curl, "the key is read from its file"
        reply = subprocess.run(["bash", "-c", curl.strip() + " --silent --show-error --max-time 240"], capture_output=True,
                               text=True, timeout=300)
        assert reply.returncode == 0, reply.stderr
        answer = json.loads(reply.stdout)
        assert answer["model"] == "it's \"v4\" $x" and answer["choices"][0]["message"]["role"] == "assistant", answer
    finally:
        run_pyllm("stop", "quoted", env=env)


# --- item 6: a failed detached server stays listed --------------------------------------------------------------------


def test_kill_9_until_the_limit_leaves_a_failed_entry_until_stop(tiny_deepseek4: Path, tmp_path: Path) -> None:
    row = probe.kill_llama_server(tiny_deepseek4, tmp_path / "home", restart=1)
    assert row["restarts"] == 1 and row["restart_seconds"][0] is not None, row
    assert row["after_limit"] == "failed" and row["listed_after_failure"], row
    assert "SIGKILL" in row["reason"] and row["logs_rc"] == 0, row
    assert row["events_deaths"] == 2 and "not restarting" in row["events_tail"], row
    assert row["stop_removes_it"], row


def test_restart_zero_records_the_death(tiny_deepseek4: Path, tmp_path: Path) -> None:
    row = probe.kill_with_restart_zero(tiny_deepseek4, tmp_path / "home")
    assert row == {"status": "failed", "events_record_death": True, "listed": ["failed"], "logs_rc": 0}, row


def test_ps_prune_removes_failed_entries(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    with probe.detached(tiny_deepseek4, pyllm_home, "gone", "--restart", "0") as srv:
        os.kill(srv.state["server_pid"], signal.SIGKILL)
        assert probe._wait(lambda: not psutil.pid_exists(srv.refresh()["supervisor_pid"]), 30)
        assert "failed:" in run_pyllm("ps", check=True).stdout
        pruned = run_pyllm("ps", "--prune", check=True)
        assert "removed entry gone" in pruned.stderr and "no managed servers" in pruned.stdout
        assert (pyllm_home / "servers" / "gone" / "server.log").exists(), "the logs stay on disk"


# --- item 7: any unreadable state is stale --------------------------------------------------------------------------------


def test_corrupt_state_files_are_stale_not_tracebacks(tmp_path: Path) -> None:
    for row in probe.corrupt_state(tmp_path / "home"):
        assert row["ps_rc"] == 0 and row["stop_all_rc"] == 0 and not row["traceback"], row
        assert row["ps_line"] == "removed stale entry bad (its process is gone)", row


# --- item 12: a shard set in a subfolder of the folder given --------------------------------------------------------------


def test_serve_a_download_folder_whose_set_sits_in_a_subfolder(servers, tmp_path: Path) -> None:
    from pyllm_a100.synth import synthesize

    download = tmp_path / "download"
    result = synthesize("tiny-deepseek4", download / "UD-Q8_K_XL" / "Tiny.gguf", split_max_size="12M", seed=42)
    (download / ".cache" / "huggingface").mkdir(parents=True)
    (download / "README.md").write_text("# a repo\n")
    server = servers.start(download)
    assert server.config.model.first == result.first.resolve() and len(server.config.model.shards) == 3
    assert server.healthy()


# --- disk full and a dropped connection (tmpfs, the loopback hub) ---------------------------------------------------------


def test_disk_full_during_synth_leaves_nothing(tmp_path: Path) -> None:
    row = probe.disk_full_synth()
    if row.get("skipped"):
        pytest.skip(row["skipped"])
    if row["rc"] == 0:
        pytest.skip("synth finished before the filler took the disk (a race this machine lost); the full run records it")
    assert row["rc"] == 1 and not row["traceback"], row
    assert "filled up while writing" in row["line"] and row["left_behind"] == [], row


@pytest.fixture(scope="module")
def glm_shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    from pyllm_a100.synth import synthesize

    out = synthesize("tiny-glm-dsa", tmp_path_factory.mktemp("glm") / "Tiny-GLM-UD-Q8_K_XL.gguf", split_max_size="13M", seed=5)
    return {f"UD-Q8_K_XL/{p.name}": p.read_bytes() for p in out.paths}


def test_disk_full_during_fetch_reports_nothing_complete(glm_shards: dict[str, bytes], tmp_path: Path) -> None:
    row = probe.disk_full_fetch(glm_shards, tmp_path / "home")
    if row.get("skipped"):
        pytest.skip(row["skipped"])
    assert row["rc"] == 1 and not row["traceback"] and not row["manifest"], row
    assert "filled up while downloading" in row["line"], row
    assert len(row["files_under_final_names"]) < 3 and row["intact"], "only whole files under their final names"


def test_a_connection_dropped_on_every_attempt_is_never_reported_complete(glm_shards: dict[str, bytes], tmp_path: Path) -> None:
    row = probe.dropped_connection(glm_shards, tmp_path / "home", persistent=True)
    assert row["rc"] == 1 and not row["traceback"] and not row["manifest"], row
    assert row["complete_files"] < 3 and row["all_complete_files_intact"], row
    assert "run the same command again to resume" in row["line"], row


# --- HTTP bad inputs and load (small) -------------------------------------------------------------------------------------


def test_hostile_http_leaves_the_server_healthy_with_no_restart(tiny_deepseek4: Path, tmp_path: Path) -> None:
    rows = probe.http_bad_inputs(tiny_deepseek4, tmp_path / "home",
                                 only=["malformed JSON", "10 MB prompt body", "invalid UTF-8 in a string", "huge n_predict",
                                       "messages is a string", "token ids out of vocabulary", "200 idle connections"], ctx_size=256)
    assert len(rows) == 7
    for row in rows:
        assert row["health"] and row["restarts"] == 0 and row["same_pid"], row


def test_a_wave_of_streaming_clients_all_succeed(tiny_deepseek4: Path, tmp_path: Path) -> None:
    row = probe.load(tiny_deepseek4, tmp_path / "home", clients=8, waves=1, max_tokens=8)
    assert row["failures"] == 0 and row["restarts"] == 0 and row["tokens"] > 0, row


# --- issue 14 item 6: a CUDA abort in one line, in events.log, as the restart reason -------------------------------------

CUDA_ABORT = """CUDA error: invalid argument
  current device: 0, in function ggml_cuda_kernel_launch at /src/llama.cpp/ggml/src/ggml-cuda/common.cuh:1707
  cudaGetLastError()
/src/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:97: CUDA error
[New LWP 4242]
[Thread debugging using libthread_db enabled]
0x00007f3a1c8e4c7f in __GI___wait4 (pid=4250, stat_loc=0x0, options=0, usage=0x0) at ../sysdeps/unix/sysv/linux/wait4.c:27
#0  0x00007f3a1c8e4c7f in __GI___wait4 () at ../sysdeps/unix/sysv/linux/wait4.c:27
#1  0x00007f3a1cd2a1b3 in ggml_print_backtrace () from /site-packages/pyllm_a100/_native/libggml-base.so
#2  0x00007f3a1cd2a366 in ggml_abort () from /site-packages/pyllm_a100/_native/libggml-base.so
#3  0x00007f3a18a1c2a2 in ggml_cuda_error(char const*, char const*, char const*, int, char const*) () from /site-packages/pyllm_a100/_native/libggml-cuda.so
#4  0x00007f3a18b7d1e0 in void mul_mat_vec_q_switch_ncols_dst<(ggml_type)39>(void const*, void const*, ...) () from /site-packages/pyllm_a100/_native/libggml-cuda.so
#5  0x00007f3a18b81a4d in ggml_cuda_mul_mat_vec_q(ggml_backend_cuda_context&, ggml_tensor const*, ggml_tensor const*, ggml_tensor const*, ggml_tensor*, ggml_cuda_mm_fusion_args_host const*) () from /site-packages/pyllm_a100/_native/libggml-cuda.so
#6  0x00007f3a18a27b6e in ggml_cuda_mul_mat(ggml_backend_cuda_context&, ggml_tensor const*, ggml_tensor const*, ggml_tensor*) () from /site-packages/pyllm_a100/_native/libggml-cuda.so
#7  0x00007f3a18a2f0c5 in ggml_backend_cuda_graph_compute(ggml_backend*, ggml_cgraph*) () from /site-packages/pyllm_a100/_native/libggml-cuda.so
"""
# The same abort as backtrace_symbols() prints it when no gdb is installed (mangled names).
CUDA_ABORT_NO_GDB = CUDA_ABORT.split("[New LWP")[0] + (
    "/site-packages/pyllm_a100/_native/libggml-base.so(ggml_abort+0x15d)[0x7f3a1cd2a366]\n"
    "/site-packages/pyllm_a100/_native/libggml-cuda.so(_Z15ggml_cuda_errorPKcS0_S0_iS0_+0x1e2)[0x7f3a18a1c2a2]\n"
    "/site-packages/pyllm_a100/_native/libggml-cuda.so(_Z23ggml_cuda_mul_mat_vec_qR25ggml_backend_cuda_contextPK11ggml_tensorS4_S4_PS2_PK29ggml_cuda_mm_fusion_args_host+0x8d)[0x7f3a18b81a4d]\n"
)


@pytest.mark.parametrize("text", [CUDA_ABORT, CUDA_ABORT_NO_GDB], ids=["gdb backtrace", "backtrace_symbols"])
def test_a_cuda_abort_after_a_real_run_is_one_line_naming_kernel_and_error(servers, tiny_deepseek4: Path, pyllm_home: Path, text: str) -> None:
    """A real llama-server run's log, then the abort text appended as the crashing server prints it."""
    from pyllm_a100.process import failures

    log_path = pyllm_home / "servers" / "v4" / "server.log"
    server = servers.start(tiny_deepseek4, log_path=log_path)
    server.stop()
    with open(log_path, "a") as log:
        log.write(text)
    line = failures.explain(server.log_text(), -signal.SIGABRT, server.config, log_path=log_path)
    assert "\n" not in line
    assert line.startswith("llama-server aborted: CUDA error 'invalid argument' in ggml_cuda_mul_mat_vec_q "
                           "(ggml_cuda_kernel_launch, common.cuh:1707) on CUDA0"), line
    assert "report it" in line and "`pyllm logs v4`" in line, line


def test_restart_reason_quotes_the_cuda_abort_and_only_the_run_that_died(servers, tiny_deepseek4: Path, pyllm_home: Path) -> None:
    """Run 1 aborts (SIGABRT) after printing the CUDA error: the restart reason names it. Run 2 aborts
    with no CUDA text: its reason must not quote run 1's lines, still in the same log file."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))  # no core files
    events: list[str] = []
    log_path = pyllm_home / "servers" / "v4" / "server.log"
    server = servers.start(tiny_deepseek4, log_path=log_path, restart=2, on_event=events.append)
    first = server.pid
    with open(log_path, "a") as log:  # what the crashing llama-server writes to its stderr (this file)
        log.write(CUDA_ABORT)
    os.kill(first, signal.SIGABRT)
    assert probe._wait(lambda: server.status == "ready" and server.pid != first, 120), events
    died = [e for e in events if " died (" in e]
    assert len(died) == 1 and "llama-server aborted: CUDA error 'invalid argument' in ggml_cuda_mul_mat_vec_q" in died[0], events
    assert "restart 1/2" in died[0]
    second = server.pid
    os.kill(second, signal.SIGABRT)
    assert probe._wait(lambda: server.status == "ready" and server.pid != second, 120), events
    died = [e for e in events if " died (" in e]
    assert len(died) == 2 and "killed by SIGABRT" in died[1] and "CUDA" not in died[1], died[1]


def test_a_detached_cuda_abort_lands_in_events_log_and_ps(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    """Through the real supervisor: the abort line is the reason in events.log and in `pyllm ps`."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with probe.detached(tiny_deepseek4, pyllm_home, "gpu", "--restart", "0") as srv:
        with open(pyllm_home / "servers" / "gpu" / "server.log", "a") as log:
            log.write(CUDA_ABORT)
        os.kill(srv.state["server_pid"], signal.SIGABRT)
        assert probe._wait(lambda: srv.refresh().get("status") == "failed", 30)
        events = (pyllm_home / "servers" / "gpu" / "events.log").read_text()
        assert "died (llama-server aborted: CUDA error 'invalid argument' in ggml_cuda_mul_mat_vec_q" in events
        assert "`pyllm logs gpu`" in events
        ps = run_pyllm("ps", check=True).stdout
        assert "failed: llama-server aborted: CUDA error 'invalid argument'" in ps


def test_foreground_death_is_one_line(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    proc = subprocess.Popen([str(PYLLM), "serve", str(tiny_deepseek4), "--port", "0", "--name", "fg"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("ready")
    (child,) = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "llama-server"]
    with open(pyllm_home / "servers" / "fg" / "server.log", "a") as log:
        log.write(CUDA_ABORT)
    child.send_signal(signal.SIGABRT)
    _, stderr = proc.communicate(timeout=60)
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(("serving ", "plan: ", "scheduling: ", "started llama-server"))]
    assert proc.returncode == 1 and len(lines) == 1, stderr
    assert lines[0].startswith("error: llama-server aborted: CUDA error 'invalid argument' in ggml_cuda_mul_mat_vec_q"), stderr


# --- the fetch <-> gguf_files import cycle is gone ---------------------------------------------------------------------


def test_no_import_cycle_between_package_modules() -> None:
    """Every import of pyllm_a100 modules (top level and inside functions) forms no cycle."""
    from layout import import_graph

    graph = import_graph()
    fetch, gguf_files, shards = "models.fetch", "models.gguf_files", "models.shards"
    assert gguf_files not in graph[fetch] and fetch not in graph.get(shards, set())

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for dep in graph.get(node, ()):
                if dep == start:
                    return path + [dep]
                if dep not in path:
                    stack.append((dep, path + [dep]))
        return None

    assert cycle_from(fetch) is None and cycle_from(gguf_files) is None


# --- docs/reliability.md stays generated ---------------------------------------------------------------------------------


def test_reliability_md_is_the_rendered_one() -> None:
    result = subprocess.run([sys.executable, "-m", "lab.tools.reliability", "render", "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr + result.stdout
    text = (REPO / "docs" / "reliability.md").read_text()
    assert "lab/scripts/reliability run" in text
    for section in ("## Bad inputs", "## HTTP bad inputs", "## Load", "## Faults", "## Security"):
        assert section in text


def test_path_flags_after_double_dash_are_made_absolute() -> None:
    from pyllm_a100.serve.llama_flags import absolute_paths

    args = ["-md", "draft.gguf", "--lora=a/x.gguf", "-c", "512", "--grammar-file", "/abs/g.gbnf", "--alias", "rel.gguf"]
    assert absolute_paths(args, cwd="/work/dir") == [
        "-md", "/work/dir/draft.gguf", "--lora=/work/dir/a/x.gguf", "-c", "512", "--grammar-file", "/abs/g.gbnf", "--alias", "rel.gguf"]
