"""pyllm service: the systemd unit (--print, --root), its key file, systemd-analyze verify, the refusal where systemd
does not run, and the unit's ExecStart run the way systemd would run it (foreground, its environment, SIGTERM)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from conftest import PYLLM, run_pyllm

from pyllm_a100.errors import EX_CONFIG

SYSTEMD_RUNS = Path("/run/systemd/system").is_dir()


def _unit(text: str) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            keys.setdefault(key, []).append(value)
    return keys


def _exec_start(unit: dict[str, list[str]]) -> list[str]:
    (line,) = unit["ExecStart"]
    return shlex.split(line.replace("%%", "%").replace("$$", "$"))


def test_print_shows_the_unit_and_installs_nothing(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    relative = os.path.relpath(tiny_deepseek4, tiny_deepseek4.parent.parent)
    result = subprocess.run([str(PYLLM), "service", "install", "coder", relative, "--print", "--host", "0.0.0.0", "--gpus", "0-3",
                             "--metrics", "--ctx-size", "4096", "--api-key", "s3cret-key", "--", "--no-mmap"],
                            cwd=tiny_deepseek4.parent.parent, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "s3cret-key" not in text, "the key goes to the EnvironmentFile, never into the unit"
    unit = _unit(text)
    assert _exec_start(unit) == [str(PYLLM), "serve", str(tiny_deepseek4), "--ctx-size", "4096", "--host", "0.0.0.0",
                                 "--gpus", "0-3", "--name", "coder", "--", "--no-mmap"]  # --metrics: the default
    assert Path(_exec_start(unit)[0]).is_absolute()
    assert unit["Environment"] == [f"PYLLM_HOME={pyllm_home}", "CUDA_CACHE_MAXSIZE=4294967296", "PYLLM_SERVICE=pyllm-coder.service",
                                   "CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0,1,2,3"]
    assert unit["EnvironmentFile"] == ["/etc/pyllm/coder.env"]
    assert unit["Restart"] == ["on-failure"] and unit["RestartPreventExitStatus"] == [str(EX_CONFIG)]
    assert unit["After"] == ["network-online.target"] and unit["Wants"] == ["network-online.target"]
    assert unit["WantedBy"] == ["multi-user.target"]
    assert not Path("/etc/systemd/system/pyllm-coder.service").exists() and not Path("/etc/pyllm/coder.env").exists()
    loopback = _unit(run_pyllm("service", "install", "local", str(tiny_deepseek4), "--print", "--user", check=True).stdout)
    assert "EnvironmentFile" not in loopback and loopback["WantedBy"] == ["default.target"]
    assert _exec_start(loopback)[2:] == [str(tiny_deepseek4), "--name", "local"]


@pytest.mark.parametrize("args, says, code", [
    (["--detach"], "a service runs pyllm serve in the foreground", 1),
    (["--name", "other"], "the service's NAME is the server's name", 1),
    (["--gpus", "0,0"], "GPU 0 is named twice", 1),
    (["--port", "abc"], "Invalid value for '--port'", 2),
    (["--run-as", "no-such-user-26"], "--run-as no-such-user-26: no such user", 1),
])
def test_bad_options_are_one_line(tiny_deepseek4: Path, args: list[str], says: str, code: int) -> None:
    result = run_pyllm("service", "install", "x", str(tiny_deepseek4), "--print", *args, timeout=60)
    assert result.returncode == code and says in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""


def test_a_model_that_is_not_there_is_refused_at_install(tiny_deepseek4: Path) -> None:
    missing = run_pyllm("service", "install", "x", str(tiny_deepseek4.parent / "nope.gguf"), "--print", timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr and missing.stderr.count("\n") == 1


def test_where_systemd_does_not_run_the_unit_is_printed_and_nothing_written(tiny_deepseek4: Path, tmp_path: Path) -> None:
    if SYSTEMD_RUNS:
        pytest.skip("systemd runs here")
    env = dict(os.environ, HOME=str(tmp_path))
    for scope in ([], ["--user"]):
        result = run_pyllm("service", "install", "coder", str(tiny_deepseek4), "--host", "0.0.0.0", *scope, env=env, timeout=60)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            "error: systemd is not running on this machine (/run/systemd/system is missing): nothing was installed; the unit "
            "is printed above (install it where systemd runs), or use pyllm serve --detach"]
        assert _exec_start(_unit(result.stdout))[1:3] == ["serve", str(tiny_deepseek4)]
        assert "API key" not in result.stdout
    assert not (tmp_path / ".config").exists()
    assert not Path("/etc/systemd/system/pyllm-coder.service").exists() and not Path("/etc/pyllm/coder.env").exists()


def test_root_install_writes_a_unit_systemd_accepts_and_a_0600_key_file(tiny_deepseek4: Path, tmp_path: Path) -> None:
    root = tmp_path / "image"
    result = run_pyllm("service", "install", "coder", str(tiny_deepseek4), "--host", "0.0.0.0", "--gpus", "4-7",
                       "--root", str(root), check=True)
    unit_file = root / "etc/systemd/system/pyllm-coder.service"
    env_file = root / "etc/pyllm/coder.env"
    assert f"wrote {unit_file} and {env_file} (mode 0600)" in result.stdout
    key = next(line for line in result.stdout.splitlines() if line.startswith("API key")).rsplit(" ", 1)[1]
    assert oct(unit_file.stat().st_mode & 0o777) == "0o644"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600" and oct(env_file.parent.stat().st_mode & 0o777) == "0o700"
    assert env_file.read_text() == f"PYLLM_API_KEY={key}\n"
    assert key not in unit_file.read_text()
    unit = _unit(unit_file.read_text())
    assert unit["EnvironmentFile"] == ["/etc/pyllm/coder.env"] and "CUDA_VISIBLE_DEVICES=4,5,6,7" in unit["Environment"]

    listed = run_pyllm("service", "list", "--root", str(root), check=True).stdout
    assert listed.splitlines()[1].split() == ["coder", "system", "-", str(tiny_deepseek4)]
    status = run_pyllm("service", "status", "coder", "--root", str(root), check=True).stdout
    assert f"unit: {unit_file} (key in {env_file})" in status and "server: not listed by pyllm ps" in status

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing (.ci/run installs systemd)")
    verified = subprocess.run([analyze, "verify", str(unit_file)], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0 and verified.stderr.strip() == "", verified.stderr
    user_unit = tmp_path / "pyllm-mine.service"
    user_unit.write_text(run_pyllm("service", "install", "mine", str(tiny_deepseek4), "--user", "--print", check=True).stdout)
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    verified = subprocess.run([analyze, "--user", "verify", str(user_unit)], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime)))
    assert verified.returncode == 0 and verified.stderr.strip() == "", verified.stderr

    removed = run_pyllm("service", "uninstall", "coder", "--root", str(root), check=True).stdout
    assert removed.splitlines() == [f"removed {unit_file}", f"removed {env_file}"]
    again = run_pyllm("service", "uninstall", "coder", "--root", str(root))
    assert again.returncode == 1 and "no pyllm service coder" in again.stderr


def test_the_units_command_runs_as_systemd_would(tiny_deepseek4: Path, tmp_path: Path, pyllm_home: Path) -> None:
    """ExecStart= with the unit's Environment= and EnvironmentFile=, cwd /, in the foreground: ready, listed by ps as the
    service's, the key from the file enforced; SIGTERM (systemctl stop) ends it with 0 and leaves no state."""
    root = tmp_path / "image"
    run_pyllm("service", "install", "svc", str(tiny_deepseek4), "--port", "0", "--api-key", "file-key-26",
              "--root", str(root), check=True)
    unit = _unit((root / "etc/systemd/system/pyllm-svc.service").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("PYLLM_API_KEY", "PYLLM_HOME")}
    env.update(item.split("=", 1) for item in unit["Environment"])
    env.update(line.split("=", 1) for line in (root / "etc/pyllm/svc.env").read_text().splitlines())
    proc = subprocess.Popen(_exec_start(unit), cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("ready"), proc.stderr.read() if proc.poll() is not None else ""
        (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
        assert entry["name"] == "svc" and entry["service"] == "pyllm-svc.service" and entry["status"] == "ready"
        assert "  service: pyllm-svc.service (pyllm service status svc)" in run_pyllm("ps", check=True).stdout
        url = f"http://127.0.0.1:{entry['port']}"
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer file-key-26"}, timeout=10).status_code == 200
        assert "file-key-26" not in " ".join(psutil.Process(entry["server_pid"]).cmdline())
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0
    assert json.loads(run_pyllm("ps", "--json", check=True).stdout) == []


def test_a_config_error_exits_78_and_a_restart_keeps_the_name(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    bad = run_pyllm("serve", str(tiny_deepseek4), "--ctx-size", "0", timeout=60)
    assert bad.returncode == EX_CONFIG and bad.stderr.count("\n") == 1
    failed = pyllm_home / "servers" / "svc"
    failed.mkdir(parents=True)
    (failed / "state.json").write_text(json.dumps({"name": "svc", "status": "failed", "error": "llama-server died",
                                                   "supervisor_pid": 0}))
    started = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--name", "svc", "--detach", timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        assert "detached as svc " in started.stdout, "the failed entry's name is taken over, not svc-2"
        (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
        assert entry["name"] == "svc" and entry["status"] == "ready"
    finally:
        run_pyllm("stop", "--all", timeout=120)


def test_exec_start_words_are_quoted_for_systemd() -> None:
    from pyllm_a100.serve.systemd import key_file_text, quote

    assert quote("/srv/models/m.gguf") == "/srv/models/m.gguf"
    assert quote("*") == '"*"' and quote("a b") == '"a b"'
    assert quote("50%") == "50%%" and quote("$HOME") == '"$$HOME"' and quote('say "hi"') == '"say \\"hi\\""'
    assert key_file_text("abc-_XYZ09") == "PYLLM_API_KEY=abc-_XYZ09\n"
    assert key_file_text('k"$ey') == "PYLLM_API_KEY='k\"$ey'\n"
