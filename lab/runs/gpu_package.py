"""The package itself with its CUDA build, installed into a folder, for the runs that measure what users run
(`pyllm serve`, `pyllm rpc-worker`, `Llama`): lab.runs.gpu_cotenancy and lab.runs.gpu_multidevice.

    python -m lab.runs.gpu_package --src .carry/llama.cpp-src.tar.gz --site /tmp/pkg [--work /tmp/dec] [--sass90]
        [--pack-to DIR [--pack-threads N]] [--from DIR] [--jobs N] [--dry-run]

Build: ``pip install --no-index --no-deps --no-build-isolation --target SITE`` of this checkout, offline, from the packed
pin (-C cmake.define.PYLLM_LLAMA_CPP_SOURCE=SRC), GGML_CUDA=ON, no web UI; the package's own CMake applies
vendor/patches and links as shipped (-Wl,--exclude-libs,ALL: patch 0043's crash is only seen so). --sass90 builds
80-virtual plus ``-gencode=arch=compute_80,code=sm_90``: the same compute_80 code compiled to H200 machine code at
build time (no PTX JIT at first use; lab.runs.gpu_build has the measurements). A SITE that already holds a CUDA build
of the same patches is kept and only its Python code refreshed (a warm machine's second call).

--pack-to DIR: the installed package (SITE/pyllm_a100) as pkg-build.tar.xz.00, .01, ... of at most 15 MiB each (a
device call brings back 8 files of 16 MiB), so that the next call can carry it instead of building (~300 s).
--from DIR: those parts, unpacked into SITE instead of building (checked against their pkg-build.sha256); without them
in DIR the build runs. Writes WORK/results/build-package.json (seconds, the command, build_info, the CUDA library's
SASS/PTX architectures); exit 1 when there is no usable build.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PART = 15 * 1024 * 1024
SASS90 = "-gencode=arch=compute_80,code=sm_90"


def pip_command(a: argparse.Namespace) -> list[str]:
    archs = "80-virtual" if a.sass90 else "80"
    cmd = [sys.executable, "-m", "pip", "install", "-v", "--no-index", "--no-deps", "--no-build-isolation",
           "--target", a.site, "-C", f"cmake.define.PYLLM_LLAMA_CPP_SOURCE={os.path.abspath(a.src)}",
           "-C", "cmake.define.GGML_CUDA=ON", "-C", f"cmake.define.CMAKE_CUDA_ARCHITECTURES={archs}",
           "-C", "cmake.define.PYLLM_UI=OFF"]
    if a.sass90:
        cmd += ["-C", f"cmake.define.CMAKE_CUDA_FLAGS={SASS90}"]
    return cmd + [str(REPO)]


def shipped_patches() -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(str(REPO / "vendor" / "patches" / "*.patch")))


def installed_info(site: str) -> dict:
    f = Path(site) / "pyllm_a100" / "_native" / "build_info.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def refresh_python(site: str) -> int:
    """This checkout's Python code over the installed copy (the build stays): the files copied. Only those that differ,
    so that a second run beside a measuring job (the pack) rewrites nothing that job imports."""
    import filecmp

    n = 0
    for source in (REPO / "pyllm_a100").rglob("*.py"):
        target = Path(site) / "pyllm_a100" / source.relative_to(REPO / "pyllm_a100")
        if target.is_file() and filecmp.cmp(source, target, shallow=False):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        n += 1
    return n


def unpack(parts_dir: str, site: str, res: dict) -> bool:
    """The parts of an earlier --pack-to, joined, checked and unpacked into SITE; False when there are none."""
    parts = sorted(glob.glob(os.path.join(parts_dir, "pkg-build.tar.xz.[0-9][0-9]")))
    if not parts:
        return False
    digest = hashlib.sha256()
    for p in parts:
        with open(p, "rb") as f:
            digest.update(f.read())
    want = Path(parts_dir, "pkg-build.sha256")
    if want.is_file() and want.read_text().split()[0] != digest.hexdigest():
        raise RuntimeError(f"the parts in {parts_dir} do not add up to pkg-build.sha256: carry all of them again")
    os.makedirs(site, exist_ok=True)
    cat = subprocess.Popen(["cat", *parts], stdout=subprocess.PIPE)
    rc = subprocess.run(["tar", "-xJf", "-", "-C", site], stdin=cat.stdout).returncode
    cat.wait()
    if rc:
        raise RuntimeError(f"unpacking {len(parts)} parts from {parts_dir} failed (tar rc={rc})")
    res.update(unpacked_from=[os.path.basename(p) for p in parts], sha256=digest.hexdigest())
    return True


def pack(site: str, out: str, res: dict, threads: int = 0) -> None:
    os.makedirs(out, exist_ok=True)
    for old in glob.glob(os.path.join(out, "pkg-build.*")):
        os.unlink(old)
    xz = f"xz -T{threads} -3" if shutil.which("xz") else None
    if xz is None:
        raise RuntimeError("no xz on PATH: the build stays here (the next call builds again)")
    whole = os.path.join(out, "pkg-build.tar.xz")
    with open(whole, "wb") as f:
        tar = subprocess.Popen(["tar", "-cf", "-", "-C", site, "pyllm_a100"], stdout=subprocess.PIPE)
        rc = subprocess.run(xz.split(), stdin=tar.stdout, stdout=f).returncode
        tar.wait()
    if rc or tar.returncode:
        raise RuntimeError(f"packing {site} failed (tar rc={tar.returncode}, xz rc={rc})")
    subprocess.run(["split", "-b", str(PART), "-d", "-a", "2", whole, whole + "."], check=True)
    digest = hashlib.sha256(Path(whole).read_bytes()).hexdigest()
    Path(out, "pkg-build.sha256").write_text(digest + "\n")
    res["packed"] = {"bytes": os.path.getsize(whole), "parts": sorted(os.path.basename(p) for p in glob.glob(whole + ".*")),
                     "sha256": digest}
    os.unlink(whole)


def archs(lib: Path) -> dict:
    if not shutil.which("cuobjdump") or not lib.is_file():
        return {}
    import re

    out = {}
    for kind, flag in (("sass", "--list-elf"), ("ptx", "--list-ptx")):
        p = subprocess.run(["cuobjdump", flag, str(lib)], capture_output=True, text=True)
        out[kind] = sorted(set(re.findall(r"sm_(\d+)", p.stdout)))
    return out


def run(a: argparse.Namespace, res: dict) -> None:
    info = installed_info(a.site)
    if info.get("cuda") and info.get("patches") == shipped_patches():
        before = Path(a.work, "results", "build-package.json")
        res.update(reused=a.site, python_files=refresh_python(a.site),
                   built_before={k: v for k, v in json.loads(before.read_text()).items() if k != "built_before"}
                   if before.is_file() else None)
    elif a.from_dir and unpack(a.from_dir, a.site, res):
        res["python_files"] = refresh_python(a.site)
    else:
        if not os.path.exists(a.src):
            raise RuntimeError(f"--src {a.src}: no such file, no --from parts to unpack, no build in {a.site} to keep")
        cmd = pip_command(a)
        res["command"] = " ".join(cmd)
        log = os.path.join(a.work, "build-package.log")
        env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(a.jobs))
        with open(log, "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd="/tmp").returncode
        if rc:
            tail = Path(log).read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"pip install rc={rc} (see {log}): {' | '.join(tail)}")
    info = installed_info(a.site)
    if not info.get("cuda"):
        raise RuntimeError(f"{a.site}/pyllm_a100/_native holds no CUDA build (build_info: {info or 'missing'})")
    res["build_info"] = {k: info.get(k) for k in ("llama_cpp_commit", "patches", "cuda", "cuda_architectures",
                                                   "cuda_version", "compiler", "rpc", "rpc_protocol", "targets")}
    res["archs"] = archs(Path(a.site) / "pyllm_a100" / "_native" / "libggml-cuda.so")
    if a.pack_to and "unpacked_from" not in res:
        try:
            pack(a.site, a.pack_to, res, a.pack_threads)
        except Exception as e:  # the build is there: only the next call's shortcut is lost
            res["pack_error"] = f"{type(e).__name__}: {e}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True, help="the packed pin (`pyllm vendor pack` .tar.gz)")
    ap.add_argument("--site", default="/tmp/pkg", help="the folder to install the package into")
    ap.add_argument("--work", default="/tmp/dec", help="the log and WORK/results/build-package.json go here")
    ap.add_argument("--sass90", action="store_true", help="compile the compute_80 code to sm_90 machine code at build time")
    ap.add_argument("--pack-to", metavar="DIR", help="also pack the installed build into DIR as parts of 15 MiB")
    ap.add_argument("--pack-threads", type=int, default=0, help="xz threads for --pack-to (0: every core)")
    ap.add_argument("--from", dest="from_dir", metavar="DIR", help="unpack an earlier --pack-to's parts from DIR instead "
                    "of building (when DIR holds them)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 16)
    ap.add_argument("--dry-run", action="store_true", help="print the pip command and the patches, do nothing")
    a = ap.parse_args()
    a.site = os.path.abspath(a.site)
    if a.dry_run:
        print(" ".join(pip_command(a)))
        print("\n".join(shipped_patches()))
        return 0
    os.makedirs(os.path.join(a.work, "results"), exist_ok=True)
    res: dict = {"ok": False, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "site": a.site, "sass90": a.sass90,
                 "run": " ".join(["python", "-m", "lab.runs.gpu_package", *sys.argv[1:]])}
    t0 = time.time()
    try:
        run(a, res)
        res["ok"] = True
    except Exception as e:  # recorded; the jobs after this one find no build and say so
        res["error"] = f"{type(e).__name__}: {e}"
    res["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(a.work, "results", "build-package.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res.get(k) for k in ("ok", "seconds", "reused", "unpacked_from", "archs", "packed", "pack_error",
                                              "error")}), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
