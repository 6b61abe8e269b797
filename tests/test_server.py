"""The managed llama-server, exercised for real: OpenAI clients, crashes, signals, keys, bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from openai import OpenAI

from conftest import PYLLM, run_pyllm
from probe import unknown_arch_model
from pyllm_a100.errors import EX_CONFIG  # pyllm serve's exit status for configuration errors
from pyllm_a100.serve import state


def client(server, api_key: str = "none") -> OpenAI:
    return OpenAI(base_url=server.openai_base_url, api_key=api_key, max_retries=0, timeout=120)


def test_chat_streaming_and_plain_completion_through_openai(servers, tiny_deepseek4: Path) -> None:
    server = servers.start(tiny_deepseek4)
    api = client(server)
    chat = api.chat.completions.create(
        model="tiny-deepseek4", messages=[{"role": "user", "content": "Hello, 你好"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].finish_reason in ("length", "stop") and chat.usage.completion_tokens > 0
    pieces = [
        c.choices[0].delta for c in api.chat.completions.create(
            model="tiny-deepseek4", messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        ) if c.choices
    ]
    assert len(pieces) >= 2
    plain = api.completions.create(model="tiny-deepseek4", prompt="The quick brown fox", max_tokens=8, temperature=0)
    assert plain.usage.completion_tokens == 8


def test_chat_with_tools_is_accepted(servers, tiny_deepseek4: Path) -> None:
    server = servers.start(tiny_deepseek4)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    reply = client(server).chat.completions.create(
        model="tiny-deepseek4", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools, max_tokens=8,
        temperature=0,  # unparseable output is content, not a 500, since patch 0007 (tests/test_tools.py samples it)
    )
    assert reply.usage.prompt_tokens > 50, "the tool schema must have been rendered into the prompt by the chat template"


def test_sixteen_concurrent_clients_are_all_answered(servers, tiny_deepseek4: Path) -> None:
    server = servers.start(tiny_deepseek4, parallel=4)
    api = client(server)
    answers: dict[int, int] = {}
    failures: list[BaseException] = []

    def ask(i: int) -> None:
        try:
            r = api.chat.completions.create(model="m", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=6)
            answers[i] = r.usage.completion_tokens
        except BaseException as exc:  # recorded, then asserted on
            failures.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert failures == [] and sorted(answers) == list(range(16)) and all(n > 0 for n in answers.values())


def test_default_server_is_loopback_with_cors_limited_and_no_security_warning(servers, tiny_deepseek4: Path) -> None:
    server = servers.start(tiny_deepseek4)
    assert server.config.host == "127.0.0.1"
    response = httpx.get(server.base_url + "/v1/models", headers={"Origin": "http://evil.example"})
    assert response.headers.get("access-control-allow-origin") is None, "a foreign page gets no CORS grant"
    local = f"http://localhost:{server.config.port}"
    assert httpx.get(server.base_url + "/v1/models", headers={"Origin": local}).headers.get("access-control-allow-origin") == local
    assert "no API key is set and CORS allows all origins" not in server.log_text()


def test_non_loopback_bind_generates_a_key_and_enforces_it(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    proc = subprocess.run(
        [str(PYLLM), "serve", str(tiny_deepseek4), "--host", "0.0.0.0", "--port", "0", "--detach", "--name", "open"],
        capture_output=True, text=True, timeout=300,
    )
    try:
        assert proc.returncode == 0, proc.stderr
        key_line = next(line for line in proc.stdout.splitlines() if line.startswith("API key"))
        key = key_line.rsplit(" ", 1)[1]
        key_file = pyllm_home / "servers" / "open" / "api_key"
        assert key_file.read_text().strip() == key
        assert oct(key_file.stat().st_mode & 0o777) == "0o600"
        port = json.loads((pyllm_home / "servers" / "open" / "state.json").read_text())["port"]
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/v1/models").status_code == 401
        assert httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(base + "/health").status_code == 200
        assert key not in (pyllm_home / "servers" / "open" / "server.log").read_text(), "the key must not reach the log"
        assert all(key not in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["name", "cmdline"]) if "llama-server" in (p.info["name"] or ""))
    finally:
        run_pyllm("stop", "open")


def _llama_server_children(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if "llama-server" in p.name()]
    except psutil.NoSuchProcess:
        return []


def _start_foreground(model: Path) -> tuple[subprocess.Popen, psutil.Process]:
    proc = subprocess.Popen([str(PYLLM), "serve", str(model), "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("ready"), proc.stderr.read() if proc.poll() is not None else ""
    (child,) = _llama_server_children(proc.pid)
    return proc, child


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_pyllm_leaves_no_llama_server(tiny_deepseek4: Path, sig: signal.Signals) -> None:
    proc, child = _start_foreground(tiny_deepseek4)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 0
    child.wait(timeout=10)
    assert not child.is_running()


def test_a_second_signal_while_stopping_is_no_traceback(tiny_deepseek4: Path) -> None:
    """systemd or `timeout` may signal twice: the second TERM/INT lands while llama-server is being stopped."""
    proc, child = _start_foreground(tiny_deepseek4)
    child.suspend()  # a stopped llama-server takes the whole TERM wait before the KILL: the window stays open
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=40) == 0
    assert "Traceback" not in proc.stderr.read()
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert child in gone and not alive


def test_pyllm_killed_with_sigkill_takes_llama_server_along(tiny_deepseek4: Path) -> None:
    proc, child = _start_foreground(tiny_deepseek4)
    proc.kill()
    proc.wait(timeout=10)
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert child in gone and not alive


def test_kill_9_while_ready_is_noticed_and_restarted(servers, tiny_deepseek4: Path) -> None:
    events: list[tuple[float, str]] = []
    server = servers.start(tiny_deepseek4, restart=2, on_event=lambda m: events.append((time.monotonic(), m)))
    first_pid = server.pid
    killed_at = time.monotonic()
    os.kill(first_pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while server.status != "ready" or server.pid == first_pid:
        assert time.monotonic() < deadline, events
        time.sleep(0.05)
    noticed = next(t for t, m in events if "died" in m and t >= killed_at)
    assert noticed - killed_at < 2.0
    assert "SIGKILL" in next(m for t, m in events if "died" in m)
    reply = client(server).completions.create(model="m", prompt="again", max_tokens=4)
    assert reply.usage.completion_tokens == 4 and server.restarts == 1


def test_ps_shows_no_pid_of_a_dead_llama_server_while_restarting(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    assert run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--detach", "--name", "rs", timeout=300).returncode == 0
    first = json.loads(run_pyllm("ps", "--json", check=True).stdout)[0]["server_pid"]
    os.kill(first, signal.SIGKILL)
    # The records `ps --json` prints (state.list_servers), read every 20 ms: a `pyllm ps` per poll takes a second or
    # more on a loaded 2-core box, about the length of the restart window, and could miss it
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not seen or seen[-1][0] != "ready" or seen[-1][1] == first):
        (entry,) = state.list_servers(clean=False)[0]
        if not seen or seen[-1] != (entry.data["status"], entry.data["server_pid"]):
            seen.append((entry.data["status"], entry.data["server_pid"]))
        time.sleep(0.02)
    assert ("restarting", None) in seen and seen[-1][0] == "ready", seen  # the restart waits 1 s
    # the killed PID only in the record from before the supervisor noticed (still "ready"), never beside "restarting"
    assert all(pid != first or status == "ready" for status, pid in seen), f"ps listed the killed llama-server {first}: {seen}"
    (row,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
    assert row["server_pid"] == seen[-1][1] and psutil.pid_exists(row["server_pid"]), (row, seen)
    assert run_pyllm("stop", "rs", check=True).returncode == 0


def test_detached_server_shows_in_ps_and_stale_entries_are_cleaned(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    started = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--detach", "--name", "bg", timeout=300)
    assert started.returncode == 0, started.stderr
    listed = json.loads(run_pyllm("ps", "--json", check=True).stdout)
    assert [e["name"] for e in listed] == ["bg"] and listed[0]["status"] == "ready"
    supervisor = psutil.Process(listed[0]["supervisor_pid"])
    supervisor.kill()  # a crash of the supervisor itself: llama-server follows, the entry goes stale
    psutil.wait_procs([supervisor], timeout=10)
    result = run_pyllm("ps", check=True)
    assert "removed stale entry bg" in result.stderr and "no managed servers" in result.stdout
    assert not psutil.pid_exists(listed[0]["server_pid"]) or psutil.Process(listed[0]["server_pid"]).status() == psutil.STATUS_ZOMBIE


def test_logs_and_stop(tiny_deepseek4: Path) -> None:
    assert run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--detach", "--name", "lg", timeout=300).returncode == 0
    logs = run_pyllm("logs", "lg", check=True)
    assert "model loaded" in logs.stdout
    pid = json.loads(run_pyllm("ps", "--json", check=True).stdout)[0]["server_pid"]
    assert run_pyllm("stop", "lg", check=True).stdout.strip() == "stopped lg"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    missing = run_pyllm("stop", "lg")
    assert missing.returncode == 1 and "no managed server named 'lg'" in missing.stderr


def test_a_name_is_kept_as_given_or_refused_so_stop_and_logs_find_it(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    """--name 'has space' was registered as 'has-space' (an über-long one cut to 48 characters): pyllm stop and
    logs with the name given then said 'no managed server named ...'."""
    for bad in ["has space", "ünïcødé", "../up", "-dash-first", "x" * 65]:
        refused = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--detach", "--name", bad, timeout=300)
        assert refused.returncode == 78 and refused.stderr.count("\n") == 1, refused.stderr
        assert f"--name {bad!r}: use letters, digits" in refused.stderr
    assert json.loads(run_pyllm("ps", "--json", check=True).stdout) == []
    name = "Model_v1.2-" + "x" * 53  # 64 characters, past the 48 of a name made from the model's
    assert run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--detach", "--name", name, timeout=300).returncode == 0
    assert [e["name"] for e in json.loads(run_pyllm("ps", "--json", check=True).stdout)] == [name]
    assert "model loaded" in run_pyllm("logs", name, check=True).stdout
    assert run_pyllm("stop", name, check=True).stdout.strip() == f"stopped {name}"


def test_stop_of_a_foreground_server_whose_parent_has_not_reaped_it_is_quick(tiny_deepseek4: Path) -> None:
    """pyllm stop waited 40 s (its whole TERM then KILL wait) for a pyllm serve that had exited as a zombie."""
    proc, child = _start_foreground(tiny_deepseek4)
    (name,) = [e["name"] for e in json.loads(run_pyllm("ps", "--json", check=True).stdout)]
    started = time.monotonic()
    assert run_pyllm("stop", name, timeout=60, check=True).stdout.strip() == f"stopped {name}"
    assert time.monotonic() - started < 15
    assert psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE  # not reaped by us until now
    assert proc.wait(timeout=10) == 0
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert child in gone and not alive


def test_progress_is_reported_until_ready(servers, tiny_deepseek4: Path) -> None:
    seen = []
    servers.start(tiny_deepseek4, on_progress=seen.append)
    assert seen[-1].phase == "ready" and seen[-1].fraction == 1.0
    assert [p.loaded for p in seen] == sorted(p.loaded for p in seen)


# --- bad input: one line, non-zero exit, nothing started --------------------------------


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from pyllm_a100.synth import synthesize

    out = tmp_path_factory.mktemp("shards") / "tiny.gguf"
    return list(synthesize("tiny-deepseek4", out, split_max_size="12M", seed=42).paths)


def _servers_of(home: Path) -> list[int]:
    """llama-servers started under this test's PYLLM_HOME (other users of the machine run their own)."""
    pids = []
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == "llama-server" and p.environ().get("PYLLM_HOME") == str(home):
                pids.append(p.pid)
        except psutil.Error:
            pass
    return pids


def bad_input_cases(tmp: Path, model: Path, shards: list[Path]) -> dict[str, tuple[list[str], str]]:
    truncated = tmp / "truncated.gguf"
    truncated.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    header_cut = tmp / "header-cut.gguf"
    header_cut.write_bytes(model.read_bytes()[:1000])
    not_gguf = tmp / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 this is a zip file, not a model")
    broken_set = tmp / "broken"
    broken_set.mkdir()
    for shard in shards[:2]:
        (broken_set / shard.name).symlink_to(shard)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    tmp.joinpath("busy-port").write_text(str(busy.getsockname()[1]))
    bad_input_cases.keep = busy  # keep the port taken for the test's duration
    return {
        "missing file": ([str(tmp / "nope.gguf")], "does not exist"),
        "non-first shard": ([str(shards[1])], "is shard 2 of 3: give shard 1"),
        "missing shard": ([str(broken_set / shards[0].name)], "1 shard(s) are missing"),
        "truncated": ([str(truncated)], "is truncated ("),
        "cut inside the header": ([str(header_cut)], "is truncated or corrupt (1000 bytes; "),
        "not a gguf": ([str(not_gguf)], "is not a GGUF file"),
        "unknown architecture": ([str(unknown_arch_model(tmp / "future.gguf"))], "architecture 'future-arch-9' is unknown"),
        "split 1x0": ([str(model), "--tensor-split", "1x0"], "count after x must be at least 1"),
        "split abc": ([str(model), "--tensor-split", "abc"], "is not WEIGHT or WEIGHTxCOUNT"),
        "split more than gpus": ([str(model), "--tensor-split", "1x8"], "GPU"),
        "port in use": ([str(model), "--port", str(busy.getsockname()[1])], "already in use"),
        "ctx 0": ([str(model), "--ctx-size", "0"], "--ctx-size 0: must be a positive"),
        "bad split mode": ([str(model), "--split-mode", "diagonal"], "choose one of layer, tensor, none"),
        "row split": ([str(model), "--split-mode", "row"], "has no row-split buffers"),
    }


CASES = ["missing file", "non-first shard", "missing shard", "truncated", "cut inside the header", "not a gguf", "unknown architecture",
         "split 1x0", "split abc", "split more than gpus", "port in use", "ctx 0", "bad split mode", "row split"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_starts_nothing(case: str, tmp_path: Path, tiny_deepseek4: Path, shard_set: list[Path], pyllm_home: Path) -> None:
    args, message = bad_input_cases(tmp_path, tiny_deepseek4, shard_set)[case]
    result = run_pyllm("serve", *args, timeout=120)
    assert result.returncode == (1 if case == "port in use" else EX_CONFIG), result.stderr  # a busy port may free up: not a config error
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert _servers_of(pyllm_home) == [], "no llama-server may be started for bad input"
    assert not list((pyllm_home / "servers").glob("*/state.json")) if (pyllm_home / "servers").exists() else True


def test_unreadable_model_is_reported_before_start(tmp_path: Path, tiny_deepseek4: Path) -> None:
    """Run as an unprivileged user (root reads everything) on a copy only root may read."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    private = tmp_path / "private.gguf"
    private.write_bytes(tiny_deepseek4.read_bytes())
    private.chmod(0o600)
    home = tmp_path / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    tmp_path.chmod(0o755)
    env = dict(os.environ, PYLLM_HOME=str(home), HOME=str(home))
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(PYLLM), "serve", str(private), "--port", "0"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == EX_CONFIG, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "is not readable by this user" in result.stderr


@pytest.mark.parametrize("command", [["serve", ""], ["serve", "   "], ["generate", "", "hi"], ["doctor", " "]])
def test_an_empty_model_argument_is_refused_not_the_current_folder(command: list[str], tiny_models: dict[str, Path]) -> None:
    """Path("") is "." : with a model in the current folder an empty argument used to serve it."""
    folder = next(iter(tiny_models.values())).parent  # holds .gguf files
    result = subprocess.run([str(PYLLM), *command], cwd=folder, capture_output=True, text=True, timeout=120)
    assert result.returncode == (EX_CONFIG if command[0] == "serve" else 1), result.stdout + result.stderr
    assert "the model is an empty string" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


# --- --split-mode tensor: the pin's own list of architectures, and the mode's requirements ----------------------------


def test_tensor_split_refusals_come_from_the_pin(info: dict) -> None:
    """build_info.json's sm_tensor_unsupported is read from llm_arch_supports_sm_tensor: deepseek4 is not in it
    (PR #26490 is in the pin), glm-dsa and deepseek32 are, and every name is an architecture the build knows."""
    refused = info["sm_tensor_unsupported"]
    assert "deepseek4" not in refused and {"glm-dsa", "deepseek32", "deepseek2"} <= set(refused)
    assert set(refused) <= set(info["architectures"])


@pytest.mark.parametrize("preset, args, message", [
    ("tiny-glm-dsa", ["--split-mode", "tensor"], "does not implement tensor split for glm-dsa"),
    ("tiny-deepseek32", ["--", "-sm", "tensor"], "does not implement tensor split for deepseek32"),
    ("tiny-deepseek4", ["--split-mode", "tensor", "--", "-fa", "off"], "needs flash attention"),
    ("tiny-deepseek4", ["--split-mode", "tensor", "--", "-ctk", "q8_0"], "needs an unquantized KV cache, not --cache-type-k q8_0"),
    ("tiny-deepseek4", ["--split-mode", "tensor", "--", "--fit=on"], "cannot be combined with --fit on"),
])
def test_tensor_split_is_refused_in_one_line_where_llama_cpp_would_fail(tiny_models: dict[str, Path], preset: str,
                                                                        args: list[str], message: str) -> None:
    result = run_pyllm("serve", str(tiny_models[preset]), *args, timeout=60)
    assert result.returncode == EX_CONFIG and message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_tensor_split_on_deepseek4_is_refused_only_for_want_of_gpus_here(tiny_models: dict[str, Path], info: dict) -> None:
    """The wrong 'does not support deepseek4' refusal is gone; on a CPU build the one line says what is missing."""
    result = run_pyllm("serve", str(tiny_models["tiny-deepseek4"]), "--split-mode", "tensor", timeout=60)
    assert "does not support deepseek4" not in result.stderr and "does not implement" not in result.stderr
    if not info["cuda"]:
        assert result.returncode == EX_CONFIG and "this build or machine has none" in result.stderr, result.stderr


def test_tensor_split_argv_turns_on_flash_attention_and_turns_off_fit(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100.models.gguf_files import resolve_model
    from pyllm_a100.serve.config import ServerConfig
    from pyllm_a100.serve.options import ServeOptions

    files = resolve_model(tiny_models["tiny-deepseek4"])
    argv = ServerConfig(ServeOptions(str(files.first), split_mode="tensor"), files).to_argv("llama-server")
    assert argv[argv.index("--flash-attn") + 1] == "on" and argv[argv.index("--fit") + 1] == "off"
    mine = ServerConfig(ServeOptions(str(files.first), split_mode="tensor", extra_args=["-fa", "auto"]), files).to_argv("llama-server")
    assert "--flash-attn" not in mine and mine[-2:] == ["-fa", "auto"]
    layer = ServerConfig(ServeOptions(str(files.first)), files).to_argv("llama-server")
    assert "--fit" not in layer and "--flash-attn" not in layer
