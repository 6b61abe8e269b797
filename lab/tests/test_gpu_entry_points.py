"""The lab's own llama.cpp builds and runs, checked on the CPU: gpu-decode's bench and batched stages over stand-in
programs with native and A100-dispatch columns in one run (issue 41), gpu-build's patch sets and CMake builds, the
dispatch re-exec, gguf-keep-layers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import dispatch
from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]


def script(name: str, *args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """A lab program by its name: gpu-decode is python -m lab.runs.gpu_decode, gguf-keep-layers lab.tools.gguf_keep_layers."""
    package = "lab.tools" if name == "gguf-keep-layers" else "lab.runs"
    return fakes.program(f"{package}.{name.replace('-', '_')}", *args, env=env, timeout=timeout)


def test_gpu_decode_bench_and_batched_mix_dispatches(tmp_path: Path) -> None:
    """pin, patched, pin@a100, patched@a100 interleaved; each column's ratio is against the pin of its own dispatch;
    every stage's JSON records the capability llama.cpp's device line gave (8.0 only under the shim)."""
    work = tmp_path / "work"
    fakes.builds(work)
    shim = fakes.dummy_shim(tmp_path / "shim")
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    result = script("gpu-decode", "--work", str(work), "--columns", "pin,patched,pin@a100,patched@a100", "--bench-layers", "4",
                    "--batched-npl", "1,16", "--dispatch-shim", str(shim), "bench", "batched", env=env)
    assert "failed" not in result.stdout, result.stdout + result.stderr
    bench = json.loads((work / "results" / "bench.json").read_text())
    assert bench["columns"] == ["pin", "patched", "pin@a100", "patched@a100"] and bench["ok"]
    assert set(bench["warmup_s"]) == {"pin", "patched", "pin@a100", "patched@a100"}
    assert {c: d["reported_capability"] for c, d in bench["dispatch"].items()} == {
        "pin": "9.0", "patched": "9.0", "pin@a100": "8.0", "patched@a100": "8.0"}
    rows = bench["4l"]
    assert rows["pin@a100"]["decode_vs_pin"] == 1.0 and rows["patched@a100"]["decode_vs_pin"] == pytest.approx(1 / 0.6, rel=0.01)
    assert rows["pin@a100"]["decode_tps"] < rows["pin"]["decode_tps"]  # the stand-in is 2 % slower under the shim
    batched = json.loads((work / "results" / "batched.json").read_text())
    assert batched["columns"] == ["pin", "patched", "pin@a100", "patched@a100"] and batched["dispatch"]["patched@a100"]["reported_capability"] == "8.0"
    assert batched["43l"]["patched@a100"]["tg_vs_pin"]["16"] == pytest.approx(1 / 0.6, rel=0.01)  # against pin@a100
    report = json.loads((tmp_path / "out" / "gpu-decode.json").read_text())
    assert report["reported_capability"]["pin@a100"] == "8.0" and "llama.cpp reported compute capability 8.0" in \
        (tmp_path / "out" / "gpu-decode.txt").read_text()


def test_gpu_decode_refuses_an_unknown_dispatch_before_running(tmp_path: Path) -> None:
    result = script("gpu-decode", "--work", str(tmp_path), "--columns", "pin@h100", "bench")
    assert result.returncode == 2 and "DISPATCH one of native, a100" in result.stderr


def test_every_entry_point_documents_its_options() -> None:
    decode = script("gpu-decode", "--help")
    assert decode.returncode == 0 and "--dispatch {native,a100}" in decode.stdout and "--dispatch-shim PATH" in decode.stdout
    assert script("gpu-build", "--help").returncode == 0


def test_gpu_build_patch_sets_and_cmake_line(tmp_path: Path) -> None:
    patches = tmp_path / "p"
    patches.mkdir()
    for n in ("0001-a", "0002-b", "0003-c", "0004-d", "0010-e"):
        (patches / f"{n}.patch").write_text("")
    env = dict(fakes.env_without_preload(), GPU_DECODE_PATCHES=str(patches))
    pin = script("gpu-build", "--src", "x", "--dry-run", "pin", env=env).stdout.splitlines()
    assert pin[:3] == ["0001-a.patch", "0002-b.patch", "0003-c.patch"] and "-DCMAKE_CUDA_ARCHITECTURES=80 " in pin[3]
    patched = script("gpu-build", "--src", "x", "--dry-run", "patched", "--patches", "all", "--sass90", "-D",
                     "GGML_CUDA_FORCE_CUBLAS=ON", env=env).stdout.splitlines()
    assert patched[:5] == [f"{n}.patch" for n in ("0001-a", "0002-b", "0003-c", "0004-d", "0010-e")]
    assert "-DCMAKE_CUDA_ARCHITECTURES=80-virtual" in patched[5] and "-DCMAKE_CUDA_FLAGS=-gencode=arch=compute_80,code=sm_90" in patched[5]
    assert patched[5].endswith("-DGGML_CUDA_FORCE_CUBLAS=ON")
    bad = script("gpu-build", "--src", "x", "--dry-run", "a/b", env=env)
    assert bad.returncode == 2 and "letters, digits" in bad.stderr
    missing = script("gpu-build", "--src", str(tmp_path / "none.tar.gz"), "pin", "--work", str(tmp_path / "w"), env=env)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_gpu_build_reports_a_patch_that_does_not_apply(tmp_path: Path) -> None:
    """A tree, a patch that does not fit it: exit 1, the JSON names the patch, no LABEL-bin and no .built marker."""
    tree = tmp_path / "src" / "llama.cpp"
    (tree / "ggml").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(x)\n")
    patches = tmp_path / "p"
    patches.mkdir()
    (patches / "0001-x.patch").write_text("--- a/CMakeLists.txt\n+++ b/CMakeLists.txt\n@@ -1 +1 @@\n-project(y)\n+project(z)\n")
    env = dict(fakes.env_without_preload(), GPU_DECODE_PATCHES=str(patches))
    result = script("gpu-build", "--src", str(tmp_path / "src"), "--work", str(tmp_path / "w"), "pin", env=env)
    assert result.returncode == 1
    res = json.loads((tmp_path / "w" / "results" / "build-pin.json").read_text())
    assert res["ok"] is False and "0001-x.patch does not apply" in res["error"] and res["patches"] == ["0001-x.patch"]
    assert not (tmp_path / "w" / "pin-bin").exists()


def stand_in_tree(root: Path, programs: dict[str, str]) -> Path:
    """A CMake C project shaped like a llama.cpp tree (a ggml folder beside CMakeLists.txt): one executable per
    ``programs`` name, each printing its text, all built into BUILD/bin as llama.cpp's are."""
    tree = root / "llama.cpp"
    (tree / "ggml").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.14)\nproject(fake C)\n"
                                         "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
                                         + "".join(f"add_executable({n} {n}.c)\n" for n in programs))
    for name, text in programs.items():
        (tree / f"{name}.c").write_text(f'#include <stdio.h>\nint main(void) {{ puts("{text}"); return 0; }}\n')
    return tree


def test_gpu_build_builds_a_patched_tree_into_label_bin(tmp_path: Path) -> None:
    """The success path on a stand-in tree (a CMake project with a llama-bench target): extracted from an archive,
    patched with fuzz 0, configured with the sm_80 line (--sass90 too: the stand-in ignores CUDA, and without a CUDA library
    to read the JSON says it was only requested), built, copied to WORK/pin-bin with its .built marker."""
    import tarfile

    tree = stand_in_tree(tmp_path / "t", {"llama-bench": "pin", "unused": "pin"})
    with tarfile.open(tmp_path / "src.tar.gz", "w:gz") as tar:
        tar.add(tree, arcname="llama.cpp")
    patches = tmp_path / "p"
    patches.mkdir()
    (patches / "0001-say-patched.patch").write_text(
        "From 1 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] say patched\n\n---\n"
        "--- a/llama-bench.c\n+++ b/llama-bench.c\n@@ -1,2 +1,2 @@\n #include <stdio.h>\n"
        '-int main(void) { puts("pin"); return 0; }\n+int main(void) { puts("patched"); return 0; }\n')
    env = dict(fakes.env_without_preload(), GPU_DECODE_PATCHES=str(patches))
    result = script("gpu-build", "--src", str(tmp_path / "src.tar.gz"), "--work", str(tmp_path / "w"), "pin", "--sass90",
                    "--targets", "llama-bench", "--jobs", "2", env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    res = json.loads((tmp_path / "w" / "results" / "build-pin.json").read_text())
    assert res["ok"] and res["patches"] == ["0001-say-patched.patch"] and res["sass90"].startswith("requested")
    assert "-DCMAKE_CUDA_ARCHITECTURES=80-virtual" in res["cmake"]
    built = tmp_path / "w" / "pin-bin"
    assert subprocess.run([str(built / "llama-bench")], capture_output=True, text=True).stdout == "patched\n"
    assert json.loads((built / ".built").read_text())["label"] == "pin" and not (built / "unused").exists()


def test_gpu_build_extend_rebuilds_a_finished_build_with_one_more_patch(tmp_path: Path) -> None:
    """--extend: a real CMake build, then one more patch on its tree: the new program, the old one untouched."""
    stand_in_tree(tmp_path / "src", {"hello": "one"})
    patches = tmp_path / "p"
    patches.mkdir()
    (patches / "0001-two.patch").write_text(
        "--- a/hello.c\n+++ b/hello.c\n@@ -1,2 +1,2 @@\n #include <stdio.h>\n"
        '-int main(void) { puts("one"); return 0; }\n+int main(void) { puts("two"); return 0; }\n')
    env = dict(fakes.env_without_preload(), GPU_DECODE_PATCHES=str(patches))
    work = tmp_path / "w"
    common = ["--src", str(tmp_path / "src"), "--work", str(work), "--targets", "hello", "--jobs", "2"]
    missing = script("gpu-build", "second", *common, "--extend", "first", "--patches", "all", env=env)
    assert missing.returncode == 1
    assert "no finished build" in json.loads((work / "results" / "build-second.json").read_text())["error"]
    (patches / "0000-none.patch").write_text("")
    first = script("gpu-build", "first", *common, "--patches", str(patches / "0000-none.patch"), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    second = script("gpu-build", "second", *common, "--extend", "first", "--patches", str(patches / "0001-two.patch"), env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    run = lambda label: subprocess.run([str(work / f"{label}-bin" / "hello")], capture_output=True, text=True).stdout
    assert (run("first"), run("second")) == ("one\n", "two\n")
    res = json.loads((work / "results" / "build-second.json").read_text())
    assert res["extends"] == "first" and res["patches"] == ["0000-none.patch", "0001-two.patch"]
    refused = script("gpu-build", "third", *common, "--extend", "first", "--sass90", env=env)
    assert refused.returncode == 2 and "leave out -D and --sass90" in refused.stderr
    # a chain: extending an extended build builds in the folder the chain shares (the eighteenth run's ctl failed on
    # "build-second is not a directory" before this was fixed)
    (patches / "0002-three.patch").write_text(
        "--- a/hello.c\n+++ b/hello.c\n@@ -1,2 +1,2 @@\n #include <stdio.h>\n"
        '-int main(void) { puts("two"); return 0; }\n+int main(void) { puts("three"); return 0; }\n')
    third = script("gpu-build", "third", *common, "--extend", "second", "--patches", str(patches / "0002-three.patch"), env=env)
    assert third.returncode == 0, third.stdout + third.stderr
    assert (run("first"), run("second"), run("third")) == ("one\n", "two\n", "three\n")
    assert json.loads((work / "results" / "build-third.json").read_text())["patches"] == [
        "0000-none.patch", "0001-two.patch", "0002-three.patch"]


def test_gguf_keep_layers_keeps_the_first_blocks_and_every_other_tensor(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """A real model cut to 1 block: block_count 1, blk.0.* and the non-block tensors kept byte for byte, llama.cpp loads it."""
    import gguf

    src = tiny_models["tiny-llama"]
    out = tmp_path / "cut.gguf"
    result = script("gguf-keep-layers", str(src), str(out), "1")
    assert result.returncode == 0, result.stderr
    before, after = gguf.GGUFReader(src), gguf.GGUFReader(out)
    arch = after.fields["general.architecture"].contents()
    assert after.fields[f"{arch}.block_count"].contents() == 1
    want = {t.name: bytes(t.data) for t in before.tensors if not t.name.startswith("blk.") or t.name.startswith("blk.0.")}
    assert {t.name: bytes(t.data) for t in after.tensors} == want
    loaded = subprocess.run([sys.executable, "-c", "import sys; from pyllm_a100 import Llama; "
                             "print(Llama(sys.argv[1], n_ctx=64, verbose=False).n_vocab())", str(out)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert loaded.returncode == 0 and int(loaded.stdout) > 0, loaded.stderr[-1000:]
    refused = script("gguf-keep-layers", str(src), str(tmp_path / "none.gguf"), "0")
    assert refused.returncode == 2 and "keep 1 to" in refused.stderr and not (tmp_path / "none.gguf").exists()


def test_the_helpers_never_import_the_runs_above_them() -> None:
    """lab.runs imports lab.bench (and lab.tools, lab.benchmarks import it too), never the reverse."""
    import re

    for folder in ("bench", "tools", "benchmarks"):
        for path in (REPO / "lab" / folder).glob("*.py"):
            assert not re.search(r"^\s*(from lab\.runs|import lab\.runs|from lab import runs)", path.read_text(), re.M), path
