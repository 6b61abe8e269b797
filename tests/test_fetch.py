"""pyllm fetch through the real huggingface_hub against a loopback hub (tests/hub.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYLLM, run_pyllm
from hub import FakeHub, HubFile

REPO = "unsloth/Tiny-GLM-GGUF"


@pytest.fixture(scope="module")
def shard_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A 3-shard tiny GLM-5 set (~12 MB per shard) named like a UD-Q8_K_XL folder, a one-file Q4_0, and a README."""
    from pyllm_a100.synth import synthesize

    root = tmp_path_factory.mktemp("hub-files")
    ud = synthesize("tiny-glm-dsa", root / "ud" / "Tiny-GLM-UD-Q8_K_XL.gguf", split_max_size="13M", seed=5)  # f16: ~12 MB shards
    q4 = synthesize("tiny-llama", root / "q4" / "Tiny-Q4_0.gguf", weight_type="q4_0", seed=5)
    files = {f"UD-Q8_K_XL/{p.name}": p.read_bytes() for p in ud.paths}
    files["Q4_0/Tiny-Q4_0.gguf"] = q4.first.read_bytes()
    files["README.md"] = b"# tiny\n"
    assert len(ud.paths) == 3
    return files


@pytest.fixture
def hub():
    server = FakeHub()
    yield server
    server.close()


@pytest.fixture
def env(hub: FakeHub, tmp_path: Path, pyllm_home: Path) -> dict[str, str]:
    return dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1",
                HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", PYLLM_HOME=str(pyllm_home),
                MODELSCOPE_ENDPOINT=hub.url, MODELSCOPE_CACHE=str(tmp_path / "ms-cache"))


SOURCES = pytest.mark.parametrize("source", ["hf", "modelscope"])


def fetch(env: dict, *args: str, timeout: float = 300, source: str = "hf") -> subprocess.CompletedProcess:
    return run_pyllm("fetch", *args, "--source", source, env=env, timeout=timeout)


def last_line(text: str) -> str:
    """The one-line error (libraries may print their own progress above it)."""
    return text.strip().splitlines()[-1]


def shards(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "UD-Q8_K_XL").glob("*.gguf"))


def root_for(home: Path, source: str) -> Path:
    return home / "models" / source / "unsloth--Tiny-GLM-GGUF"


@SOURCES
def test_include_pattern_fetches_one_set_verifies_and_serve_finds_it(hub, env, shard_files, pyllm_home, source) -> None:
    hub.add_repo(REPO, shard_files)
    result = fetch(env, REPO, "--include", "UD-Q8_K_XL/*", source=source)
    assert result.returncode == 0, result.stderr
    root = root_for(pyllm_home, source)
    assert shards(root) == [f"Tiny-GLM-UD-Q8_K_XL-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert not (root / "README.md").exists() and not (root / "Q4_0").exists()
    manifest = json.loads((root / ".pyllm-manifest.json").read_text())
    assert manifest["source"] == source and all(f["verified"] for f in manifest["files"])
    if source == "hf":
        assert manifest["commit"] == hub.repos[REPO].commit
    assert manifest["sets"] == [{"first": "UD-Q8_K_XL/Tiny-GLM-UD-Q8_K_XL-00001-of-00003.gguf", "count": 3,
                                 "quant": "UD-Q8_K_XL", "complete": True,
                                 "bytes": sum(len(v) for k, v in shard_files.items() if k.startswith("UD-"))}]
    assert "serve it: pyllm serve unsloth/Tiny-GLM-GGUF:UD-Q8_K_XL" in result.stdout
    listed = json.loads(run_pyllm("models", "--json", env=env, check=True).stdout)
    assert [(r["repo"], r["quant"], r["shards"], r["complete"]) for r in listed] == [(REPO, "UD-Q8_K_XL", 3, True)]
    doctor = run_pyllm("doctor", f"{REPO}:UD-Q8_K_XL", "--json", env=env)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["model"]["path"] == str(root / "UD-Q8_K_XL" / "Tiny-GLM-UD-Q8_K_XL-00001-of-00003.gguf")
    before = len(hub.requests)
    again = fetch(env, REPO, "--include", "UD-Q8_K_XL/*", source=source)
    assert again.returncode == 0, again.stderr
    assert not [r for r in hub.requests[before:] if "/resolve/" in r[1] or r[1].endswith("/repo")], "a complete set is not downloaded again"


@SOURCES
def test_a_connection_cut_mid_file_is_resumed_with_a_range_request(hub, env, shard_files, pyllm_home, source) -> None:
    files = dict(shard_files)
    name = "UD-Q8_K_XL/Tiny-GLM-UD-Q8_K_XL-00002-of-00003.gguf"
    files[name] = HubFile(files[name], cut_after=11 << 20)  # past huggingface_hub's 10 MiB read chunk
    hub.add_repo(REPO, files)
    result = fetch(env, REPO, "--include", "UD-Q8_K_XL/*", "--workers", "1", source=source)
    assert result.returncode == 0, result.stderr
    ranged = [r for r in hub.requests if r[0] == "GET" and "Range" in r[2] and int(r[2]["Range"][6:].split("-")[0]) > 0]
    assert ranged, "the cut file must be resumed from where it stopped, not restarted"
    assert len(shards(root_for(pyllm_home, source))) == 3


@SOURCES
def test_a_corrupted_shard_is_detected_removed_and_fetched_again(hub, env, shard_files, pyllm_home, source) -> None:
    files = dict(shard_files)
    name = "UD-Q8_K_XL/Tiny-GLM-UD-Q8_K_XL-00003-of-00003.gguf"
    files[name] = HubFile(files[name], corrupt=True)
    hub.add_repo(REPO, files)
    result = fetch(env, REPO, "--include", "UD-Q8_K_XL/*", source=source)
    assert result.returncode == 1 and last_line(result.stderr).startswith("error: ") and "corrupt" in last_line(result.stderr)
    root = root_for(pyllm_home, source)
    assert not (root / name).exists() and not (root / ".pyllm-manifest.json").exists()
    hub.repos[REPO].files[name].corrupt = False
    fixed = fetch(env, REPO, "--include", "UD-Q8_K_XL/*", source=source)
    assert fixed.returncode == 0, fixed.stderr


@SOURCES
def test_a_shard_missing_on_the_hub_is_reported(hub, env, shard_files, source) -> None:
    files = {k: v for k, v in shard_files.items() if "00002-of-00003" not in k}
    hub.add_repo(REPO, files)
    result = fetch(env, REPO, "--include", "UD-Q8_K_XL/*", source=source)
    assert result.returncode == 1 and "lacks Tiny-GLM-UD-Q8_K_XL-00002-of-00003.gguf" in last_line(result.stderr)


@SOURCES
def test_unknown_repo_is_a_404_mapped_to_our_error(hub, env, source) -> None:
    result = fetch(env, "nobody/nothing-GGUF", source=source)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "repository nobody/nothing-GGUF was not found" in result.stderr


@SOURCES
def test_gated_repo_needs_a_token(hub, env, shard_files, source) -> None:
    hub.add_repo(REPO, shard_files, gated=True)
    denied = fetch(env, REPO, "--include", "Q4_0/*", source=source)
    assert denied.returncode == 1 and denied.stderr.count("\n") == 1
    assert "gated or" in denied.stderr and "token" in denied.stderr
    blank = fetch(env, REPO, "--include", "Q4_0/*", "--token", "", source=source)  # as `HF_TOKEN=` in a script: no token
    assert blank.returncode == 1 and "Traceback" not in blank.stderr and "gated or" in last_line(blank.stderr), blank.stderr
    allowed = fetch(env, REPO, "--include", "Q4_0/*", "--token", f" {hub.token}\n", source=source)  # pasted with blanks
    assert allowed.returncode == 0, allowed.stderr


@SOURCES
def test_errors_follow_the_status_not_the_address(hub, env, shard_files, source) -> None:
    """A mirror under a path that reads like a status code: gated, missing and a failing API each get their own line."""
    hub.prefix = "/mirror-404-401"
    env = dict(env, HF_ENDPOINT=hub.url + hub.prefix, MODELSCOPE_ENDPOINT=hub.url + hub.prefix)
    hub.add_repo(REPO, shard_files, gated=True)
    hub.add_repo("broken/mirror-GGUF", shard_files, status=500)
    denied = fetch(env, REPO, "--include", "Q4_0/*", source=source)
    assert denied.returncode == 1 and "gated or private" in denied.stderr and denied.stderr.count("\n") == 1
    missing = fetch(env, "nobody/nothing-GGUF", source=source)
    assert missing.returncode == 1 and "repository nobody/nothing-GGUF was not found" in missing.stderr
    broken = fetch(env, "broken/mirror-GGUF", source=source)
    assert broken.returncode == 1 and "answered HTTP 500" in last_line(broken.stderr), broken.stderr  # above it: the client's retries
    allowed = fetch(env, REPO, "--include", "Q4_0/*", "--token", hub.token, source=source)
    assert allowed.returncode == 0, allowed.stderr


@SOURCES
def test_an_endpoint_answering_html_is_named_in_one_line(hub, env, shard_files, source) -> None:
    """HF_ENDPOINT / MODELSCOPE_ENDPOINT on a sign-in page or a plain web server: no traceback, the variable to fix."""
    hub.add_repo(REPO, shard_files)
    hub.login_page = True
    result = fetch(env, REPO, "--include", "Q4_0/*", source=source)
    variable = "HF_ENDPOINT" if source == "hf" else "MODELSCOPE_ENDPOINT"
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "not JSON" in last_line(result.stderr) and variable in last_line(result.stderr), result.stderr


@SOURCES
def test_disk_space_is_checked_before_downloading(hub, env, shard_files, source) -> None:
    files = dict(shard_files)
    files["UD-Q8_K_XL/huge-00001-of-00001.gguf"] = HubFile(b"x" * 10, listed_size=10 * 2**40)
    hub.add_repo(REPO, files)
    result = fetch(env, REPO, "--include", "UD-Q8_K_XL/*", source=source)
    assert result.returncode == 1 and "still to download but" in result.stderr and "GiB free" in result.stderr
    assert not [r for r in hub.requests if "/resolve/" in r[1] or r[1].endswith("/repo")], "nothing may be downloaded"


def test_patterns_that_match_nothing_or_mix_quantizations_are_flagged(hub, env, shard_files) -> None:
    hub.add_repo(REPO, shard_files)
    nothing = fetch(env, REPO, "--include", "UD-Q8_K_X/*", "--dry-run")
    assert nothing.returncode == 1 and "matches nothing; close: UD-Q8_K_XL/*" in nothing.stderr
    mixed = fetch(env, REPO, "--include", "*.gguf", "--dry-run")
    assert mixed.returncode == 0 and "mixes 2 quantizations (Q4_0, UD-Q8_K_XL)" in mixed.stderr
    assert "4 file(s)" in mixed.stdout


def test_unreachable_hub_suggests_a_mirror(env) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = fetch(dict(env, HF_ENDPOINT=f"http://127.0.0.1:{port}"), REPO, "--include", "x/*")
    assert result.returncode == 1 and "cannot reach" in result.stderr and "HF_ENDPOINT" in result.stderr


def test_ctrl_c_leaves_a_resumable_download(hub, env, shard_files, pyllm_home) -> None:
    files = dict(shard_files)
    for name in [k for k in files if k.startswith("UD-")]:
        files[name] = HubFile(files[name], slow=0.3)
    hub.add_repo(REPO, files)
    proc = subprocess.Popen([str(PYLLM), "fetch", REPO, "--include", "UD-Q8_K_XL/*", "--workers", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = pyllm_home / "models" / "hf" / "unsloth--Tiny-GLM-GGUF"
    deadline = time.monotonic() + 60
    while not list(root.rglob("*.incomplete")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0 and not (root / ".pyllm-manifest.json").exists()
    # Never a cut-short file under its final name: what is there is whole, the rest is *.incomplete or absent.
    finished = {str(p.relative_to(root)) for p in (root / "UD-Q8_K_XL").glob("*.gguf")}
    assert len(finished) < 3
    for name in finished:
        assert (root / name).read_bytes() == shard_files[name]
    before = len(hub.requests)
    for f in hub.repos[REPO].files.values():
        f.slow = 0.0
    done = fetch(env, REPO, "--include", "UD-Q8_K_XL/*")
    assert done.returncode == 0, done.stderr
    fetched_again = {r[1].split("/resolve/")[1].split("/", 1)[1] for r in hub.requests[before:] if r[0] == "GET" and "/resolve/" in r[1]}
    assert fetched_again and not fetched_again & finished, "files completed before Ctrl-C are not downloaded again"
