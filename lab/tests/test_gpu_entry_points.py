"""--dispatch on the GPU entry points (issue 41), checked on the CPU: gpu-decode's bench and batched stages over stand-in
programs with native and A100-dispatch columns in one run, the argument handling of gpu-concurrency, gpu-token-check,
gpu-kld and gpu-build (lab/runs), the re-exec that gpu-check and lab/benchmarks/gpu.py use, and the KLD gap matrix (kld_gap.py)
on the CPU with the real SmolLM2."""

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


def test_gpu_token_check_compares_each_run_with_the_pin_of_its_dispatch_and_its_native_twin(tmp_path: Path) -> None:
    """Over stand-in llama-servers: patched's tokens equal the pin's at both dispatches while its log-probabilities
    differ in the last bits; under the shim both builds' tokens part from their native runs at token 40 on the long
    prompt (the A100 host paths may pick other kernels); every entry says its dispatch and the capability logged."""
    work = tmp_path / "work"
    fakes.builds(work)
    (work / "tiny-v4.gguf").write_bytes(b"GGUF")
    shim = fakes.dummy_shim(tmp_path / "shim")
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    result = script("gpu-token-check", str(work), "pin", "patched", "pin@a100", "patched@a100", "--dispatch-shim", str(shim),
                    env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "out" / "token-check.json").read_text())
    assert data["reported_capability"] == {"pin": "9.0", "patched": "9.0", "pin@a100": "8.0", "patched@a100": "8.0"}
    s = data["summary"]
    native, a100 = s["patched:v4-4l:p300"], s["patched@a100:v4-4l:p300"]
    assert native["reference"] == "pin" and native["equal_to_pin"] and not native["logprobs_equal_to_pin"]
    assert a100["reference"] == "pin@a100" and a100["equal_to_pin"] and a100["equal_to_native"] is False
    assert a100["first_difference_from_native"] == 40 and s["patched@a100:v4-4l:p8"]["equal_to_native"] is True
    assert s["pin@a100:tiny-deepseek4:p8"] == {"equal_to_native": True, "first_difference_from_native": None,
                                              "logprobs_equal_to_native": True}
    assert data["all_equal"] is True and data["patched@a100:v4-4l:p8"]["dispatch"] == "a100"


def test_gpu_token_check_takes_more_files_and_prompt_lengths(tmp_path: Path) -> None:
    """--model NAME=PATH adds a file (the 256-expert V4 for 0038's chunks) and --prompt-lengths the prompts."""
    work = tmp_path / "work"
    fakes.builds(work)
    (work / "tiny-v4.gguf").write_bytes(b"GGUF")
    (work / "v4-4l-256.gguf").write_bytes(b"GGUF")
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    result = script("gpu-token-check", str(work), "pin", "patched", "--model", f"v4-4l-256={work / 'v4-4l-256.gguf'}",
                    "--prompt-lengths", "8,16", env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out" / "token-check.json").read_text())["summary"]
    assert {k.split(":", 1)[1] for k in summary} == {f"{m}:{p}" for m in ("tiny-deepseek4", "v4-4l", "v4-4l-256")
                                                      for p in ("p8", "p16")}
    bad = script("gpu-token-check", str(work), "pin", "--model", "v4-4l-256", env=env)
    assert bad.returncode == 2 and "--model NAME=PATH" in bad.stderr


def test_gpu_decode_refuses_an_unknown_dispatch_before_running(tmp_path: Path) -> None:
    result = script("gpu-decode", "--work", str(tmp_path), "--columns", "pin@h100", "bench")
    assert result.returncode == 2 and "DISPATCH one of native, a100" in result.stderr


@pytest.mark.parametrize("name,args,message", [
    ("gpu-concurrency", ["W", "M", "1", "--columns", "pin,patched@h100"], "DISPATCH one of"),
    ("gpu-concurrency", ["W", "M", "1", "--columns", "pin,patched+NOSUCH@a100"], "unknown switch"),
    ("gpu-token-check", ["W", "pin", "patched@h100"], "DISPATCH one of"),
    ("gpu-token-check", ["W", "pin", "patched+NOSUCH@a100"], "unknown switch"),
    ("gpu-kld", ["--bin", "B", "--model", "M", "--out", "O", "--gap", "--dispatches", "native,h100"], "--dispatches"),
    ("gpu-kld", ["--bin", "B", "--model", "M", "--out", "O", "--dispatch", "h100"], "invalid choice"),
])
def test_entry_points_refuse_a_bad_dispatch(name: str, args: list[str], message: str, tmp_path: Path) -> None:
    args = [str(tmp_path / a) if a in ("W", "M", "B", "O") else a for a in args]
    result = script(name, *args)
    assert result.returncode != 0 and message in (result.stderr + result.stdout) and "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["gpu-decode", "gpu-concurrency", "gpu-token-check", "gpu-kld", "gpu-check", "gpu-a100-check",
                                  "gpu-multitoken", "gpu-build"])
def test_every_entry_point_documents_its_options(name: str) -> None:
    result = script(name, "--help")
    assert result.returncode == 0, result.stderr
    if name != "gpu-build":
        assert "--dispatch {native,a100}" in result.stdout and "--dispatch-shim PATH" in result.stdout
    assert "--dispatch {native,a100}" in fakes.program("lab.benchmarks.gpu", "--help", timeout=60).stdout


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


REEXEC = """
import os, sys
from lab.bench import dispatch  # this checkout's, on PYTHONPATH
dispatch.reexec_with(sys.argv[1], {shim!r} if sys.argv[1] == "a100" else None, [sys.executable, *sys.argv])
print(os.environ.get("LD_PRELOAD", ""), dispatch.current(), os.environ.get("PYLLM_LAB_DISPATCH", "-"))
"""


def test_reexec_puts_the_shim_in_the_whole_process_and_native_takes_it_out(tmp_path: Path) -> None:
    shim = fakes.dummy_shim(tmp_path / "shim")
    prog = tmp_path / "p.py"
    prog.write_text(REEXEC.format(shim=str(shim)))
    env = dict(fakes.env_without_preload(), PYTHONPATH=str(REPO))
    a100 = subprocess.run([sys.executable, str(prog), "a100"], capture_output=True, text=True, env=env,
                          timeout=60, check=True).stdout.split()
    assert a100 == [str(shim.resolve()), "a100", "a100"]
    native = subprocess.run([sys.executable, str(prog), "native"], capture_output=True, text=True, timeout=60, check=True,
                            env=dict(env, LD_PRELOAD=str(shim))).stdout.split()
    assert native == ["native", "native"]  # LD_PRELOAD emptied, nothing left to print for it
    plain = subprocess.run([sys.executable, str(prog), "native"], capture_output=True, text=True, timeout=60, check=True,
                           env=env).stdout.split()
    assert plain == ["native", "-"]  # no re-exec when there is nothing to change


def test_kld_gap_matrix_on_the_cpu(smollm2: Path, tmp_path: Path) -> None:
    """The gap matrix's CPU side with this package's llama-quantize and llama-perplexity and the real SmolLM2 (two
    chunks of 256 tokens): F32 against its own base ~0; the Q4_1 file, whose weights ARE the base's, only its activation
    rounding; Q8_0 and Q4_0 (Q8_0 embeddings as in the Q4_1 file) re-round those weights, Q4_0 badly on so small a
    model; rows flat; the table."""
    from lab.gpucheck import kld_gap
    from pyllm_a100.llamacpp.native import native_dir

    result = kld_gap.gap(native_dir(), smollm2, tmp_path / "out", tmp_path / "work", dispatcher=dispatch.Dispatcher(),
                         ctx=256, chunks=2, threads=2, gpu=False)
    assert json.loads((tmp_path / "out" / "gpu-kld-gap.json").read_text()) == result and not result["errors"]
    rows = {r["type"]: r for r in result["rows"]}
    assert list(rows) == ["f32", "q8_0", "q4_0", "q4_1"] and all(r["device"] == "cpu" and r["dispatch"] is None for r in rows.values())
    assert rows["f32"]["kld_mean"] < 1e-3 < rows["q4_1"]["kld_mean"]
    assert rows["q4_1"]["kld_mean"] < rows["q8_0"]["kld_mean"] < rows["q4_0"]["kld_mean"] < 1.0  # 0.0026, 0.0034, 0.25 here
    assert "--token-embedding-type q8_0" in (tmp_path / "out" / "kld-logs" / "kld-quantize-q4_0.log").read_text()
    assert all("llama-perplexity" in r["command"] and "--kl-divergence" in r["command"] for r in rows.values())
    table = kld_gap.table(result)
    assert "| weights | cpu |" in table and table.count("\n| ") == 6  # header, rule, four types


def test_kld_gap_table_puts_each_dispatch_in_its_own_column() -> None:
    from lab.gpucheck import kld_gap

    def row(t, device, disp, build, kld, cap=None):
        return {"type": t, "device": device, "dispatch": disp, "build": build, "kld_mean": kld, "same_top_pct": 95.0,
                "reported_capability": cap}

    result = {"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "ctx": 512, "errors": ["q4_0 cublas: llama-perplexity exited 1"],
              "rows": [row("f32", "cpu", None, "main", 1e-6), row("f32", "gpu", "native", "main", 0.0004, "9.0"),
                       row("f32", "gpu", "a100", "main", 0.0005, "8.0"), row("q4_1", "cpu", None, "main", 0.0026),
                       row("q4_1", "gpu", "native", "main", 0.0119, "9.0"), row("q4_1", "gpu", "a100", "main", 0.0118, "8.0"),
                       row("q4_1", "gpu", "native", "cublas", 0.0031, "9.0")]}
    text = kld_gap.table(result)
    assert "| weights | cpu | gpu native | gpu a100 | cublas native |" in text
    assert "| q4_1 | 0.002600 (95.00 %) | 0.011900 (95.00 %, cc 9.0) | 0.011800 (95.00 %, cc 8.0) | 0.003100 (95.00 %, cc 9.0) |" in text
    assert "| f32 | 0.000001 (95.00 %) |" in text and text.rstrip().endswith("not measured: q4_0 cublas: llama-perplexity exited 1")
    assert kld_gap.parse_builds(["cublas=/x/bin@a100"]) == [("cublas", Path("/x/bin"), "a100")]
    with pytest.raises(Exception, match="LABEL=DIR"):
        kld_gap.parse_builds(["/x/bin"])


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
