"""One llama.cpp build for the lab's GPU runs: the packed pin plus a patch set, CMake sm_80 with Ninja, into WORK/LABEL-bin.

    python -m lab.runs.gpu_build --src .carry/llama.cpp-src.tar.gz --work /tmp/dec LABEL [--patches base|all|FILE...]
        [--targets T,T...] [-D KEY=VALUE ...] [--sass90] [--jobs N] [--extend FROM]

    pin:     python -m lab.runs.gpu_build --src ... --work /tmp/dec pin --patches base    # 0001-0003, the pin's crash fixes
    patched: python -m lab.runs.gpu_build --src ... --work /tmp/dec patched --patches all # every patch in the folder
    one more: python -m lab.runs.gpu_build --src ... --work /tmp/dec new --extend patched --patches vendor/patches/0036-*

Patch sets: ``base`` = the folder's patches whose names start 0001, 0002 or 0003 (python -m lab.runs.gpu_decode's BASE), ``all``
= every *.patch in name order; the folder is $GPU_DECODE_PATCHES or vendor/patches; or name the files. Each applies with
``patch -p1 --fuzz=0`` (git format-patch files too). Separate trees, so two builds run as two gpu-session jobs and the
first can be used while the second compiles (a patched rebuild recompiles nearly everything anyway: 0001-0003 and the
CUDA patches touch headers every kernel includes).

--sass90 adds ``-gencode arch=compute_80,code=sm_90`` and builds 80-virtual: the same compute_80 PTX (device code sees
__CUDA_ARCH__ 800, the host __CUDA_ARCH_LIST__ 800), compiled to H200 machine code at build time, which is what the
driver's JIT makes of it at first use. It saves that JIT at run time (the first llama-bench of a fresh build spent
105-131 s in it, the first test-backend-ops MUL_MAT 257 s) at no build-time cost; the figures are the JIT's. When
CMake refuses it the build falls back to plain 80 and says so. -D passes CMake defines (e.g. GGML_CUDA_FORCE_CUBLAS=ON).

Writes WORK/LABEL-bin (programs and libraries; run them with LD_LIBRARY_PATH=that folder), WORK/LABEL-bin/.built and
WORK/results/build-LABEL.json (seconds, patches, cmake line, the fatbin's SASS/PTX archs when cuobjdump exists, the CUDA
runtime functions libggml-cuda.so takes from a shared libcudart: those lab/scripts/a100-dispatch.c can answer); log
WORK/build-LABEL.log. Exit 1 on a failed patch or build (the JSON says which).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PATCH_DIR = os.environ.get("GPU_DECODE_PATCHES") or os.path.join(HERE, "..", "..", "vendor", "patches")
TARGETS = ["llama-bench", "llama-batched-bench", "llama-server", "test-backend-ops", "llama-perplexity", "llama-quantize",
           "llama-completion"]
BASE_PREFIXES = ("0001", "0002", "0003")
SASS90 = "-gencode=arch=compute_80,code=sm_90"


def patch_set(names: list[str], folder: str = PATCH_DIR) -> list[str]:
    """``base`` / ``all`` / explicit files or globs -> the patch files, in order."""
    every = sorted(glob.glob(os.path.join(folder, "*.patch")))
    if names == ["base"]:
        out = [p for p in every if os.path.basename(p)[:4] in BASE_PREFIXES]
    elif names == ["all"]:
        out = every
    else:
        out = [f for n in names for f in (sorted(glob.glob(n)) or [n])]
        missing = [f for f in out if not os.path.isfile(f)]
        if missing:
            raise SystemExit(f"gpu-build: no such patch {', '.join(missing)}")
    if names and names != ["all"] and not out:
        raise SystemExit(f"gpu-build: --patches {' '.join(names)} selects no patch in {folder}")
    return out


def cmake_line(root: str, build: str, defines: list[str], sass90: bool) -> list[str]:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []  # Ninja on the GPU machine; make where there is none
    cmd = ["cmake", "-S", root, "-B", build, *generator, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON",
           f"-DCMAKE_CUDA_ARCHITECTURES={'80-virtual' if sass90 else '80'}", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF",
           "-DLLAMA_BUILD_TESTS=ON", "-DCMAKE_SKIP_BUILD_RPATH=ON"]
    if sass90:
        cmd.append(f"-DCMAKE_CUDA_FLAGS={SASS90}")
    return cmd + [f"-D{d}" for d in defines]


def tree_root(d: str) -> str:
    roots = [r for r, dirs, files in os.walk(d) if "CMakeLists.txt" in files and "ggml" in dirs and r.count(os.sep) - d.count(os.sep) <= 4]
    if not roots:
        raise RuntimeError(f"no llama.cpp tree under {d}")
    return min(roots, key=len)


def sh(cmd: list[str], log: str, cwd: str | None = None) -> int:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd).returncode


def archs(lib: str) -> dict[str, list[str]]:
    """SASS and PTX architectures in libggml-cuda.so (cuobjdump; empty without it)."""
    if not shutil.which("cuobjdump") or not os.path.exists(lib):
        return {}
    out = {}
    for kind, flag in (("sass", "--list-elf"), ("ptx", "--list-ptx")):
        p = subprocess.run(["cuobjdump", flag, lib], capture_output=True, text=True)
        out[kind] = sorted(set(re.findall(r"sm_(\d+)", p.stdout)))
    return out


def build(a: argparse.Namespace, res: dict) -> None:
    w, label = a.work, a.label
    log = f"{w}/build-{label}.log"
    open(log, "w").close()
    if a.extend:
        extend(a, res, log)
    else:
        fresh(a, res, log)
    out = f"{w}/{label}-bin"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(os.path.join(res["build"], "bin"), out, symlinks=True)
    res["archs"] = archs(os.path.join(out, "libggml-cuda.so"))
    if a.sass90 and res["archs"] and res.get("sass90", "").startswith("requested"):  # what the library really holds
        res["sass90"] = ("compute_80 PTX compiled to sm_90 SASS at build time" if "90" in res["archs"].get("sass", [])
                         else "requested, but libggml-cuda.so holds no sm_90 SASS: PTX JIT at first use")
    if os.path.exists(os.path.join(out, "libggml-cuda.so")):  # what the a100-dispatch shim can reach (a shared libcudart)
        from lab.bench.dispatch import imported
        res["dispatch_shim_reaches"] = imported(os.path.join(out, "libggml-cuda.so"))


def apply(patches: list[str], root: str, log: str, res: dict) -> None:
    res.setdefault("patches", []).extend(os.path.basename(p) for p in patches)
    for p in patches:
        if sh(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-i", os.path.abspath(p)], log, cwd=root):
            raise RuntimeError(f"{os.path.basename(p)} does not apply with fuzz 0 (see {log})")


def compile_targets(a: argparse.Namespace, bld: str, log: str) -> None:
    targets = a.targets.split(",")
    if sh(["cmake", "--build", bld, "-j", str(a.jobs), "--target", *targets], log):
        raise RuntimeError(f"building {' '.join(targets)} failed (see {log})")


def extend(a: argparse.Namespace, res: dict, log: str) -> None:
    """--extend FROM: FROM's tree and build folder, --patches applied on top, rebuilt incrementally (ninja recompiles
    what the patches touched); FROM-bin stays as FROM built it, its tree is LABEL's from now on."""
    w, base = a.work, a.extend
    src, bld = f"{w}/src-{base}", f"{w}/build-{base}"
    built = f"{w}/{base}-bin/.built"
    if not os.path.exists(built):
        raise RuntimeError(f"--extend {base}: no finished build ({built} is missing)")
    prior = json.load(open(built))
    bld = prior.get("build") or bld  # FROM may itself extend another build: its tree and folder are that one's
    res.update(extends=base, patches=list(prior.get("patches", [])), tree=prior.get("tree") or tree_root(src),
               build=bld, log=log, cmake=prior.get("cmake"), sass90=prior.get("sass90"))
    apply(patch_set(a.patches), res["tree"], log, res)
    compile_targets(a, bld, log)


def fresh(a: argparse.Namespace, res: dict, log: str) -> None:
    w, label = a.work, a.label
    src, bld = f"{w}/src-{label}", f"{w}/build-{label}"
    for d in (src, bld):  # fresh tree and build folder: a tar's old mtimes would fool ninja
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(src)
    if os.path.isdir(a.src):
        shutil.copytree(a.src, os.path.join(src, "t"), symlinks=True)
    else:
        with tarfile.open(a.src) as tar:
            tar.extractall(src, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    root = tree_root(src)
    res.update(tree=root, build=bld, log=log)
    apply(patch_set(a.patches), root, log, res)
    cfg = cmake_line(root, bld, a.define, a.sass90)
    if sh(cfg, log) and a.sass90:
        res["sass90"] = "CMake refused it: built plain 80 (PTX JIT at first use)"
        shutil.rmtree(bld, ignore_errors=True)
        cfg = cmake_line(root, bld, a.define, False)
        if sh(cfg, log):
            raise RuntimeError(f"cmake failed (see {log})")
    elif a.sass90:
        res["sass90"] = "requested (-gencode=arch=compute_80,code=sm_90); no cuobjdump to confirm"
    res["cmake"] = " ".join(cfg)
    compile_targets(a, bld, log)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("label", help="the build's name: WORK/LABEL-bin (pin, patched, patched-cublas, ...)")
    ap.add_argument("--src", required=True, help="the packed pin (`pyllm vendor pack` .tar.gz) or an extracted folder")
    ap.add_argument("--work", default="/tmp/dec")
    ap.add_argument("--patches", nargs="+", default=["base"], help="base, all, or patch files (default base)")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("-D", "--define", action="append", default=[], metavar="KEY=VALUE", help="a CMake define")
    ap.add_argument("--sass90", action="store_true", help="compile the compute_80 PTX to sm_90 SASS at build time")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 16)
    ap.add_argument("--dry-run", action="store_true", help="print the patches and the cmake line, build nothing")
    ap.add_argument("--extend", metavar="FROM", help="apply --patches on top of the finished build FROM's tree and "
                    "rebuild it incrementally (minutes, not a full build); FROM's cmake settings hold")
    a = ap.parse_args()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", a.label):
        ap.error(f"label {a.label!r}: letters, digits, '.', '_' and '-' only")
    if any("=" not in d for d in a.define):
        ap.error("-D takes KEY=VALUE, e.g. GGML_CUDA_FORCE_CUBLAS=ON")
    if a.extend and (a.define or a.sass90):
        ap.error("--extend keeps FROM's cmake settings: leave out -D and --sass90")
    if a.extend == a.label:
        ap.error("--extend FROM: FROM must be another build's label")
    if a.dry_run:
        print("\n".join(os.path.basename(p) for p in patch_set(a.patches)))
        print(" ".join(cmake_line("SRC", f"{a.work}/build-{a.label}", a.define, a.sass90)))
        return 0
    if not a.extend and not os.path.exists(a.src):
        ap.error(f"--src {a.src}: no such file or folder")
    os.makedirs(os.path.join(a.work, "results"), exist_ok=True)
    res: dict = {"label": a.label, "ok": False, "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "command": " ".join(sys.argv)}
    t0 = time.time()
    try:
        build(a, res)
        res["ok"] = True
    except Exception as e:  # recorded; the jobs waiting on this build see ok false
        res["error"] = f"{type(e).__name__}: {e}"
    res["seconds"] = round(time.time() - t0, 1)
    json.dump(res, open(os.path.join(a.work, "results", f"build-{a.label}.json"), "w"), indent=1)
    if res["ok"]:
        json.dump(res, open(os.path.join(a.work, f"{a.label}-bin", ".built"), "w"), indent=1)
    print(json.dumps({k: res.get(k) for k in ("label", "ok", "seconds", "sass90", "archs", "error")}), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
