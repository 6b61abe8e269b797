"""Steps environment, install, build-info, cuobjdump and test-llama-archs: the machine, the sm_80 build of this
package from the packed source, what the CUDA library holds, llama.cpp's own architecture test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import runner
from .runner import LOGS, REPO, sh, step


@step("environment")
def environment() -> dict:
    gpus = sh(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,compute_cap", "--format=csv,noheader"])
    cuda = re.search(r"CUDA Version: *([\d.]+)", sh(["nvidia-smi"]))
    nvcc = re.search(r"release ([\d.]+)", sh(["nvcc", "--version"]))
    return {
        "gpus": [dict(zip(("index", "name", "driver", "memory", "compute_capability"), [x.strip() for x in line.split(",")]))
                 for line in gpus.strip().splitlines()],
        "driver_cuda": cuda[1] if cuda else None,
        "nvcc": nvcc[1] if nvcc else None,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


def built(site: Path) -> bool:
    info = site / "pyllm_a100" / "_native" / "build_info.json"
    return info.is_file() and json.loads(info.read_text()).get("cuda") is True


@step("install")
def install(archive: Path, wheels: Path | None, site: Path) -> dict:
    if built(site):  # a warm machine from an earlier call: keep its CUDA build, refresh the Python code
        for source in (REPO / "pyllm_a100").rglob("*.py"):
            target = site / "pyllm_a100" / source.relative_to(REPO / "pyllm_a100")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        return {"reused": str(site)}
    env = dict(os.environ)
    if wheels:
        sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(site),
            *map(str, sorted(wheels.glob("*.whl")))])
    cmd = [sys.executable, "-m", "pip", "install", "-v", "--no-index", "--no-deps", "--no-build-isolation",
           "--target", str(site), "-C", f"cmake.define.PYLLM_LLAMA_CPP_SOURCE={archive}",
           "-C", "cmake.define.GGML_CUDA=ON", "-C", "cmake.define.CMAKE_CUDA_ARCHITECTURES=80",
           "-C", "cmake.define.PYLLM_BUILD_TESTS=ON", str(REPO)]
    started = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    (runner.OUT / "build.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"build failed after {seconds:.0f} s: {result.stderr.strip().splitlines()[-3:]}")
    preflight = [ln.strip() for ln in (result.stdout + result.stderr).splitlines() if "preflight" in ln]
    return {"command": " ".join(cmd), "build_seconds": round(seconds, 1), "preflight": preflight}


@step("build-info")
def build_info() -> dict:
    from pyllm_a100.llamacpp.native import build_info as info

    return info()


@step("cuobjdump")
def cuobjdump() -> dict:
    from pyllm_a100.llamacpp.native import native_dir

    lib = native_dir() / "libggml-cuda.so"
    elf = sh(["cuobjdump", "--list-elf", str(lib)])
    ptx = sh(["cuobjdump", "--list-ptx", str(lib)])
    sass = sorted(set(re.findall(r"sm_(\d+)", elf)))
    virtual = sorted(set(re.findall(r"sm_(\d+)", ptx)))
    exported = sh(["nm", "-D", "--defined-only", str(lib)])
    return {"library": str(lib), "sass_archs": sass, "ptx_archs": virtual,
            "elf_entries": len(elf.splitlines()), "sample": elf.splitlines()[:3],
            "exported_std_symbols": sum(1 for ln in exported.splitlines() if " _ZNSt" in ln)}



@step("test-llama-archs")
def llama_archs(site: Path) -> dict:
    """llama.cpp's own random models of each architecture, CUDA0 vs its CPU backend (the pinned tree's test)."""
    build = next((p.parent for p in sorted(REPO.glob("build/*/CMakeCache.txt"))), None)
    if build is None:
        raise RuntimeError(f"no CMake build folder under {REPO}/build: run the install step first")
    started = time.monotonic()
    made = subprocess.run(["cmake", "--build", str(build), "--target", "test-llama-archs", "-j", str(os.cpu_count())],
                          capture_output=True, text=True)
    (runner.OUT / "test-llama-archs-build.log").write_text(made.stdout + made.stderr)
    if made.returncode:
        raise RuntimeError(f"building test-llama-archs failed: {made.stderr.strip().splitlines()[-3:]}")
    exe = next(build.rglob("bin/test-llama-archs"))
    env = dict(os.environ, LD_LIBRARY_PATH=str(site / "pyllm_a100" / "_native"))
    rows, summaries = [], {}
    for arch in ("llama", "deepseek4", "glm-dsa", "deepseek32"):
        run = subprocess.run([str(exe), "-a", f"^{arch}$", "-s", "42", "-b", "CUDA0"], capture_output=True, text=True,
                             env=env, timeout=600)
        text = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
        (LOGS / f"test-llama-archs-{arch}.log").write_text(text)
        for line in text.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 5 and cells[0] == arch:
                nmse = re.search(r"\(([-+.\de]+)\)", cells[3])
                rows.append({"arch": arch, "device": cells[1], "config": cells[2], "status": cells[3].split()[0],
                             "nmse": float(nmse[1]) if nmse else None, "roundtrip": cells[4]})
        summary = re.search(r"Summary: .*", text)
        summaries[arch] = {"rc": run.returncode, "summary": summary[0] if summary else text.strip().splitlines()[-1:]}
        if run.returncode and summary:  # the table passed but the process died after it: say so, keep what it printed
            summaries[arch]["after_summary"] = text[summary.end():].strip().splitlines()[-20:]
    aborted = sorted(a for a, s in summaries.items() if s["rc"])
    if aborted:
        print(f"== test-llama-archs: {', '.join(aborted)} exited {summaries[aborted[0]]['rc']} after the summary: "
              "not a pass (the lines after the summary are in the result)", flush=True)
    return {"build_seconds": round(time.monotonic() - started, 1), "rows": rows, "summaries": summaries,
            "exit_failures": aborted,  # a nonzero exit (-6: SIGABRT at exit) is no pass: all_ok false, README says it
            "all_ok": any(r["status"] == "OK" for r in rows) and all(r["status"] in ("OK", "SKIP") for r in rows)
            and not aborted}
