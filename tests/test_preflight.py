"""The CMake preflight stops toolchain traps in seconds, and a CUDA configure targets sm_80 only.

Each test configures this repository's CMakeLists.txt with real CMake; stand-in tools
(a compiler like gcc 8.5, an nvcc and an nvidia-smi of chosen versions) sit first on PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.build


def _cmake() -> str:
    local = Path(sys.executable).parent / "cmake"
    return str(local) if local.exists() else (shutil.which("cmake") or pytest.fail("cmake is not installed"))


def _tool(bin_dir: Path, name: str, body: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def _nvidia_smi(bin_dir: Path, *, driver_cuda: str, gpu: str = "NVIDIA A100-SXM4-80GB", cc: str = "8.0") -> Path:
    return _tool(
        bin_dir,
        "nvidia-smi",
        f"""\
        case "$*" in
          -L) echo "GPU 0: {gpu} (UUID: GPU-00000000-0000-0000-0000-000000000000)"; exit 0 ;;
          *query-gpu*) echo "0, {gpu}, {cc}"; exit 0 ;;
        esac
        echo "| NVIDIA-SMI 590.44.01    Driver Version: 590.44.01    CUDA Version: {driver_cuda}     |"
        """,
    )


def configure(build: Path, *defines: str, path_prefix: Path | None = None, env: dict | None = None):
    """Run CMake's configure step; returns (process, output with whitespace collapsed, seconds)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "CC", "CXX")}
    full_env.update(env or {})
    if path_prefix is not None:
        full_env["PATH"] = f"{path_prefix}{os.pathsep}{full_env['PATH']}"
    started = time.monotonic()
    result = subprocess.run(
        # PYLLM_UI=OFF: these configures test the toolchain preflight; the web UI's npm build (minutes) is
        # tested by the real install and tests/test_web_ui.py
        [_cmake(), "-S", str(REPO), "-B", str(build), "-DGGML_RPC=ON", "-DGGML_NATIVE=OFF", "-DPYLLM_UI=OFF", *defines],
        capture_output=True, text=True, env=full_env, timeout=900,
    )
    seconds = time.monotonic() - started
    # CMake wraps long messages; compare text with whitespace collapsed.
    return result, " ".join((result.stdout + result.stderr).split()), seconds


def test_compiler_without_working_filesystem_stops_with_the_cxx17_message(tmp_path: Path) -> None:
    # Like gcc 8.5: compiles C++17, but a program using std::filesystem does not link.
    fake = _tool(
        tmp_path / "bin",
        "g++-8.5",
        """\
        case " $* " in *" -c "*|*" -E "*) exec g++ "$@" ;; esac
        case "$*" in *filesystem*)
          echo "filesystem.cpp:(.text+0x2a): undefined reference to \\`std::filesystem::__cxx11::path::_M_split_cmpts()'" >&2
          echo "collect2: error: ld returned 1 exit status" >&2
          exit 1 ;;
        esac
        exec g++ "$@"
        """,
    )
    result, output, seconds = configure(tmp_path / "build", "-DGGML_CUDA=OFF", env={"CXX": str(fake)})
    assert result.returncode != 0
    assert "cannot build a C++17 program that uses <filesystem>" in output
    assert "undefined reference" in output and "gcc_linux-64" in output
    assert "llama.cpp version" not in output, "preflight must stop before llama.cpp is configured"
    assert seconds < 60


def test_nvcc_newer_than_the_driver_stops_with_the_version_message(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    _tool(bin_dir, "nvcc", 'echo "nvcc: NVIDIA (R) Cuda compiler driver"\necho "Cuda compilation tools, release 13.4, V13.4.48"\n')
    _nvidia_smi(bin_dir, driver_cuda="13.1")
    result, output, seconds = configure(tmp_path / "build", "-DGGML_CUDA=AUTO", path_prefix=bin_dir)
    assert result.returncode != 0
    assert "GGML_CUDA=AUTO and nvidia-smi lists a GPU" in output
    assert "nvcc is CUDA 13.4 but the installed driver supports CUDA 13.1" in output
    assert "CUDACXX=/usr/local/cuda-13.1/bin/nvcc" in output
    assert "llama.cpp version" not in output
    assert seconds < 60


def test_auto_without_a_gpu_builds_for_cpu(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    _tool(empty, "nvidia-smi", "exit 9\n")  # a driver tool that finds no GPU
    result, output, _ = configure(tmp_path / "build", "-DGGML_CUDA=AUTO", path_prefix=empty)
    assert result.returncode == 0, output[-2000:]
    assert "building for CPU only (GGML_CUDA=AUTO and no NVIDIA GPU is visible" in result.stdout
    info = json.loads((tmp_path / "build" / "build_info.json").read_text())
    assert info["cuda"] is False


def test_bad_cuda_mode_is_refused(tmp_path: Path) -> None:
    result, output, _ = configure(tmp_path / "build", "-DGGML_CUDA=MAYBE")
    assert result.returncode != 0 and "GGML_CUDA=MAYBE is not one of ON, OFF, AUTO" in output


def _stand_in_library(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "empty.c"
    source.write_text("int pyllm_stand_in;\n")
    out = directory / name
    subprocess.run(["gcc", "-shared", "-o", str(out), str(source)], check=True)
    return out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs a CUDA toolkit (nvcc)")
def test_cuda_configure_without_gpu_targets_sm80_only(tmp_path: Path) -> None:
    """nvcc 13.0 present, no GPU. This machine's toolkit lacks cuBLAS and the driver stub, which
    configure only needs as file paths: empty stand-ins are named for them. The stand-in
    nvidia-smi reports an H200 (9.0) so the uncovered-GPU warning can be checked too."""
    nvcc_release = re.search(r"release (\d+\.\d+)", subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout)
    bin_dir = tmp_path / "bin"
    _nvidia_smi(bin_dir, driver_cuda=nvcc_release.group(1), gpu="NVIDIA H200", cc="9.0")
    libs = tmp_path / "libs"
    build = tmp_path / "build"
    result, output, _ = configure(
        build, "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=80",
        f"-DCUDA_cublas_LIBRARY={_stand_in_library(libs, 'libcublas.so')}",
        f"-DCUDA_cublasLt_LIBRARY={_stand_in_library(libs, 'libcublasLt.so')}",
        f"-DCUDA_cuda_driver_LIBRARY={_stand_in_library(libs, 'libcuda.so')}",
        path_prefix=bin_dir,
    )
    assert result.returncode == 0, output[-4000:]
    assert "nvcc accepts host compiler" in output
    assert 'CMAKE_CUDA_ARCHITECTURES="80;90"' in output
    assert "GPU 0 (NVIDIA H200) has compute capability 9.0" in output
    info = json.loads((build / "build_info.json").read_text())
    assert info["cuda"] is True and info["cuda_architectures"] == ["80"]
    assert "ggml-cuda" in info["targets"]
    ninja_or_make = "".join(p.read_text(errors="replace") for p in build.rglob("flags.make")) + "".join(
        p.read_text(errors="replace") for p in build.glob("build.ninja")
    )
    archs = set(re.findall(r"compute_(\d+)", ninja_or_make)) | set(re.findall(r"sm_(\d+)", ninja_or_make))
    assert archs == {"80"}, f"CUDA code generated for {archs}"


def test_custom_source_tree_is_configured_with_its_own_commit(tmp_path: Path) -> None:
    """A fork or branch checkout builds as-is; build info names its path and commit, and the preflight still runs."""
    pinned = REPO / "vendor" / "llama.cpp"
    if not (pinned / "include" / "llama.h").is_file():
        pytest.skip("vendor/llama.cpp is populated by the package build")
    fork = tmp_path / "llama.cpp-fork"
    shutil.copytree(pinned, fork, ignore=shutil.ignore_patterns(".pyllm-source.json"))
    git = ["git", "-C", str(fork), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(fork)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "a DeepSeek-V4 work branch"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=9", "HEAD"], capture_output=True, text=True).stdout.strip()
    result, output, _ = configure(tmp_path / "build", "-DGGML_CUDA=OFF", f"-DPYLLM_LLAMA_CPP_SOURCE={fork}")
    assert result.returncode == 0, output[-3000:]
    assert "builds C++17 with std::filesystem" in output
    info = json.loads((tmp_path / "build" / "build_info.json").read_text())
    assert info["source"] == str(fork) and info["source_kind"] == "tree"
    assert info["llama_cpp_commit"] == head and info["patches"] == []
