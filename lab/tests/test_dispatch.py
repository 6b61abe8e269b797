"""lab/bench/dispatch.py and the a100-dispatch shim (issue 41): column syntax, environments, the log proof, and the shim
itself compiled and run against a stand-in libcudart that answers like an H200 (no GPU needed)."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest

from lab.bench import dispatch

H200_LOG = """ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143167 MiB):
  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143167 MiB
"""
A100_LOG = """a100-dispatch: device 0 reported as cc 8.0, 108 SMs, 166912 B opt-in smem/block, 167936 B smem/SM, 40 MiB L2 (really cc 9.0, 132 SMs, 232448 B, 233472 B, 60 MiB)
ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143167 MiB):
  Device 0: NVIDIA H200, compute capability 8.0, VMM: yes, VRAM: 143167 MiB
"""


def test_columns_take_the_default_dispatch_unless_they_name_one() -> None:
    assert dispatch.split_column("pin") == ("pin", "native")
    assert dispatch.split_column("patched+HC@a100") == ("patched+HC", "a100")
    assert dispatch.split_column("patched", default="a100") == ("patched", "a100")
    assert dispatch.split_column("patched@native", default="a100") == ("patched", "native")
    with pytest.raises(dispatch.DispatchError, match=r"BUILD\[\+SWITCH...\]\[@DISPATCH\]"):
        dispatch.split_column("pin@h100")
    with pytest.raises(dispatch.DispatchError):
        dispatch.split_column("@a100")


def test_column_names_carry_the_dispatch_only_when_it_is_not_native() -> None:
    """pin, patched, pin@a100, patched@a100: one run, both dispatches side by side (interleaved by the scripts)."""
    cols = dispatch.expand_columns(["pin", "patched", "pin@a100", "patched@a100"])
    assert cols == [("pin", "pin", "native"), ("patched", "patched", "native"), ("pin@a100", "pin", "a100"),
                    ("patched@a100", "patched", "a100")]
    assert [n for n, _, _ in dispatch.expand_columns(["pin", "patched"], default="a100")] == ["pin@a100", "patched@a100"]
    with pytest.raises(dispatch.DispatchError, match="named twice"):
        dispatch.expand_columns(["pin@a100", "pin"], default="a100")


def test_preload_puts_the_shim_first_and_native_takes_it_out(tmp_path: Path) -> None:
    shim = tmp_path / "a100-dispatch.so"
    shim.write_bytes(b"")
    env = dispatch.preload_env("a100", shim, inherited="/x/graph-count.so")
    assert env == {"LD_PRELOAD": f"{shim.resolve()}:/x/graph-count.so"}
    assert dispatch.current(env) == "a100"
    assert dispatch.preload_env("native", None, inherited=f"{shim}:/x/graph-count.so") == {"LD_PRELOAD": "/x/graph-count.so"}
    assert dispatch.preload_env("native", None, inherited="") == {}
    assert dispatch.current({"LD_PRELOAD": "/x/graph-count.so"}) == "native"
    with pytest.raises(dispatch.DispatchError, match="needs the shim"):
        dispatch.preload_env("a100", None, inherited="")


def test_the_proof_is_llama_cpps_own_device_line() -> None:
    assert dispatch.reported_capability(H200_LOG) == "9.0"
    assert dispatch.reported_capability(A100_LOG) == "8.0"
    assert dispatch.reported_capability("no gpu here") is None
    assert dispatch.record("a100", A100_LOG) == {"dispatch": "a100", "reported_capability": "8.0", "shim_line": True}
    assert dispatch.record("native", H200_LOG) == {"dispatch": "native", "reported_capability": "9.0", "shim_line": False}
    bad = dispatch.record("a100", H200_LOG)
    assert "did not take" in bad["problem"] and bad["reported_capability"] == "9.0"
    assert "left in LD_PRELOAD" in dispatch.record("native", A100_LOG)["problem"]
    assert "no 'Device 0" in dispatch.record("native", "")["problem"]


def stand_in_server(folder: Path, log: str) -> Path:
    """A stand-in llama-server whose --list-devices prints ``log`` on stderr, as ggml-cuda's start-up does."""
    folder.mkdir()
    exe = folder / "llama-server"
    exe.write_text("#!/bin/sh\ncat <<'EOF' >&2\n" + log + "EOF\n")
    exe.chmod(0o755)
    return folder


def test_a_server_log_without_a_device_line_is_answered_by_list_devices(tmp_path: Path) -> None:
    """llama-server logs no ggml-cuda device line: server_record then asks the build's --list-devices and checks it
    against the dispatch asked for; a log that has the line keeps its own record."""
    env = dict(os.environ, LD_PRELOAD="")
    served = "main: server is listening on http://127.0.0.1:8080\n"
    a100 = stand_in_server(tmp_path / "a100", A100_LOG)
    assert dispatch.server_record("a100", served, a100, env) == {
        "dispatch": "a100", "reported_capability": "8.0", "shim_line": True, "program": "llama-server"}
    h200 = stand_in_server(tmp_path / "h200", H200_LOG)
    assert "did not take" in dispatch.server_record("a100", served, h200, env)["problem"]
    assert dispatch.server_record("native", H200_LOG, tmp_path / "missing", env) == dispatch.record("native", H200_LOG)
    missing = dispatch.server_record("native", served, tmp_path / "missing", env)
    assert missing["reported_capability"] is None and "no llama.cpp program" in missing["problem"]


def test_every_entry_point_takes_the_same_options(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    dispatch.add_arguments(parser)
    args = parser.parse_args(["--dispatch", "a100", "--dispatch-shim", str(tmp_path / "s.so")])
    d = dispatch.from_args(args)
    assert d.default == "a100" and d.split("pin") == ("pin", "a100") and d.split("pin@native") == ("pin", "native")
    with pytest.raises(dispatch.DispatchError, match="no such file"):
        d.env("a100")
    assert d.env("native", inherited="") == {}
    with pytest.raises(SystemExit):
        parser.parse_args(["--dispatch", "h100"])


needs_cuda_headers = pytest.mark.skipif(dispatch.cuda_include() is None, reason="no CUDA headers (cuda_runtime_api.h)")

# Stand-in for libcudart.so.13 answering like an H200; the occupancy call counts 4 KiB of static shared memory.
FAKE_CUDART = r"""
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>
cudaError_t cudaRuntimeGetVersion(int *v) { const char *e = getenv("FAKE_CUDART_VERSION"); *v = e ? atoi(e) : CUDART_VERSION; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    memset(p, 0, sizeof *p); strcpy(p->name, "NVIDIA H200"); p->major = 9; p->minor = 0; p->multiProcessorCount = 132;
    p->sharedMemPerBlock = 49152; p->sharedMemPerBlockOptin = 232448; p->sharedMemPerMultiprocessor = 233472;
    p->l2CacheSize = 62914560; p->warpSize = 32; p->totalGlobalMem = 150ull << 30;
    return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    (void) d;
    switch (a) {
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMultiProcessorCount: *v = 132; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 232448; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = 233472; break;
    case cudaDevAttrL2CacheSize: *v = 62914560; break;
    default: *v = 1;
    }
    return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *f) { (void) f; memset(a, 0, sizeof *a); a->sharedSizeBytes = 4096; return cudaSuccess; }
static int blocks(size_t dyn) { size_t per = 4096 + dyn + 1024; int b = (int) (233472 / per); return b > 32 ? 32 : b; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *f, int bs, size_t dyn) { (void) f; (void) bs; *n = blocks(dyn); return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, const void *f, int bs, size_t dyn, unsigned fl) { (void) f; (void) bs; (void) fl; *n = blocks(dyn); return cudaSuccess; }
"""

PROBE = r"""
#include <cuda_runtime_api.h>
#include <stdio.h>
int main(void) {
    struct cudaDeviceProp p;
    for (int i = 0; i < 2; i++) cudaGetDeviceProperties(&p, 0);
    printf("props %s %d.%d sms=%d optin=%zu persm=%zu l2=%d smpb=%zu\n", p.name, p.major, p.minor, p.multiProcessorCount,
           p.sharedMemPerBlockOptin, p.sharedMemPerMultiprocessor, p.l2CacheSize, p.sharedMemPerBlock);
    int v[7];
    cudaDeviceGetAttribute(&v[0], cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&v[1], cudaDevAttrComputeCapabilityMinor, 0);
    cudaDeviceGetAttribute(&v[2], cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&v[3], cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    cudaDeviceGetAttribute(&v[4], cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0);
    cudaDeviceGetAttribute(&v[5], cudaDevAttrL2CacheSize, 0);
    cudaDeviceGetAttribute(&v[6], cudaDevAttrCooperativeLaunch, 0);
    printf("attrs %d %d %d %d %d %d %d\n", v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
    int a, b, c;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&a, (const void *) main, 128, 60000);
    cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&b, (const void *) main, 128, 0, 0);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, (const void *) main, 128, 20000);
    printf("occupancy %d %d %d\n", a, b, c);
    return 0;
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("shim")
    inc = dispatch.cuda_include()
    shim = dispatch.build_shim(d / "a100-dispatch.so")
    (d / "fake.c").write_text(FAKE_CUDART)
    (d / "probe.c").write_text(PROBE)
    (d / "version.map").write_text("libcudart.so.13 { global: *; };\n")  # versioned exports, as the real libcudart's
    subprocess.run(["gcc", "-shared", "-fPIC", f"-I{inc}", "-Wl,-soname,libcudart.so.13", f"-Wl,--version-script={d / 'version.map'}",
                    "-o", str(d / "libcudart.so.13"), str(d / "fake.c")], check=True)
    subprocess.run(["gcc", f"-I{inc}", "-o", str(d / "probe"), str(d / "probe.c"), str(d / "libcudart.so.13"),
                    f"-Wl,-rpath,{d}"], check=True)
    return {"dir": d, "shim": shim, "probe": d / "probe"}


def run_probe(built: dict[str, Path], preload: bool, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, **env)
    e.pop("LD_PRELOAD", None)
    if preload:
        e.update(dispatch.preload_env("a100", built["shim"], inherited=""))
    return subprocess.run([str(built["probe"])], capture_output=True, text=True, env=e, check=True, timeout=60)


@needs_cuda_headers
def test_the_shim_compiles_as_documented_and_exports_the_wrapped_functions(tmp_path: Path) -> None:
    """The command in the shim's header, verbatim but for the output path; nm -D shows every wrapped function."""
    out = tmp_path / "a100-dispatch.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", f"-I{dispatch.cuda_include()}", "-Wall", "-Wextra", "-Werror",
                    "-o", str(out), str(dispatch.SHIM_SOURCE), "-ldl"], check=True)
    assert set(dispatch.WRAPPED) <= dispatch.exported(out)
    assert {"cudaGetDeviceProperties", "cudaGetDeviceProperties_v2", "cudaDeviceGetAttribute"} <= dispatch.exported(out)


@needs_cuda_headers
def test_without_the_shim_the_stand_in_answers_like_an_h200(built: dict[str, Path]) -> None:
    """The probe takes cudaGetDeviceProperties@libcudart.so.13 (a versioned reference, as libggml-cuda.so does): the
    unversioned definitions of the preloaded shim still come first, and dlsym(RTLD_NEXT) finds the versioned ones."""
    nm = subprocess.run(["nm", "-D", "--undefined-only", str(built["probe"])], capture_output=True, text=True).stdout
    assert "cudaGetDeviceProperties@libcudart.so.13" in nm
    out = run_probe(built, preload=False)
    assert "props NVIDIA H200 9.0 sms=132 optin=232448 persm=233472 l2=62914560 smpb=49152" in out.stdout
    assert "attrs 9 0 132 232448 233472 62914560 1" in out.stdout
    assert "occupancy 3 32 9" in out.stdout and "a100-dispatch" not in out.stderr


@needs_cuda_headers
def test_under_the_shim_the_same_calls_answer_like_an_a100(built: dict[str, Path]) -> None:
    """Properties and attributes overwritten, everything else (name, smem per block, cooperative launch) the real one;
    occupancy clamped by an A100 SM's 164 KiB: (4 KiB static + 60000 B + 1 KiB reserved, in 128 B units) fits 2, not 3;
    20000 B fits 6 on an A100 (9 on the H200); no shared memory: the real answer. One line on stderr, once."""
    out = run_probe(built, preload=True)
    assert "props NVIDIA H200 8.0 sms=108 optin=166912 persm=167936 l2=41943040 smpb=49152" in out.stdout
    assert "attrs 8 0 108 166912 167936 41943040 1" in out.stdout
    assert "occupancy 2 32 6" in out.stdout
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("a100-dispatch:")]
    assert lines == ["a100-dispatch: device 0 reported as cc 8.0, 108 SMs, 166912 B opt-in smem/block, 167936 B smem/SM, "
                     "40 MiB L2 (really cc 9.0, 132 SMs, 232448 B, 233472 B, 60 MiB)"]
    assert dispatch.SHIM_LINE.search(out.stderr)[2] == "8.0"
    assert "occupancy 3 32 9" in run_probe(built, preload=True, A100_DISPATCH_OCCUPANCY="0").stdout


@needs_cuda_headers
def test_a_runtime_of_another_cuda_major_passes_properties_through(built: dict[str, Path]) -> None:
    """The struct layouts of CUDA 12 and 13 differ: the shim writes into cudaDeviceProp only when libcudart's major
    version is its headers'; attributes (plain ints) are answered either way."""
    out = run_probe(built, preload=True, FAKE_CUDART_VERSION="12080")
    assert "props NVIDIA H200 9.0 sms=132" in out.stdout and "attrs 8 0 108" in out.stdout
    assert "libcudart 12.8 is not the CUDA 13 the shim was built with" in out.stderr
