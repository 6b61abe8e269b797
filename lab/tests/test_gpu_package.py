"""lab.runs.gpu_package's plumbing on the CPU (the CUDA build itself needs the GPU machine): the pip command it would
run, an installed build kept as it is, packed into parts and unpacked from them into another folder, and the refusals
(no pip run here: it would start a build)."""

from __future__ import annotations

import json
from pathlib import Path

from lab.runs.gpu_package import shipped_patches
from lab.tests import fakes


def site_with_a_build(site: Path, cuda: bool = True) -> None:
    native = site / "pyllm_a100" / "_native"
    native.mkdir(parents=True)
    (native / "build_info.json").write_text(json.dumps({"cuda": cuda, "patches": shipped_patches()}))
    (native / "libggml-cuda.so").write_bytes(bytes(range(256)) * 4096)  # 1 MiB of something


def test_the_dry_run_names_the_package_build_with_sass90(tmp_path: Path) -> None:
    result = fakes.program("lab.runs.gpu_package", "--src", "SRC.tar.gz", "--site", str(tmp_path), "--sass90", "--dry-run")
    assert result.returncode == 0, result.stderr
    line = result.stdout.splitlines()[0]
    assert "--no-index --no-deps --no-build-isolation --target" in line and "cmake.define.GGML_CUDA=ON" in line
    assert "CMAKE_CUDA_ARCHITECTURES=80-virtual" in line and "CMAKE_CUDA_FLAGS=-gencode=arch=compute_80,code=sm_90" in line
    assert "PYLLM_UI=OFF" in line and any(p.startswith("0043-") for p in result.stdout.splitlines()[1:])


def test_a_kept_build_is_packed_into_parts_and_unpacked_elsewhere(tmp_path: Path) -> None:
    site, parts, work = tmp_path / "site", tmp_path / "parts", tmp_path / "w"
    nothing = fakes.program("lab.runs.gpu_package", "--src", "missing.tar.gz", "--site", str(site), "--work", str(work),
                            "--from", str(tmp_path / "none"))
    assert nothing.returncode == 1 and "no such file" in nothing.stdout  # no source, no parts, no build: refused
    site_with_a_build(site)  # a build there is kept, with or without the source
    packed = fakes.program("lab.runs.gpu_package", "--src", "missing.tar.gz", "--site", str(site), "--work", str(work),
                           "--pack-to", str(parts), "--pack-threads", "1")
    assert packed.returncode == 0, packed.stdout + packed.stderr
    record = json.loads((work / "results" / "build-package.json").read_text())
    assert record["ok"] and record["reused"] == str(site) and record["packed"]["parts"] == ["pkg-build.tar.xz.00"]
    assert (parts / "pkg-build.sha256").read_text().strip() == record["packed"]["sha256"]
    other = tmp_path / "other"
    unpacked = fakes.program("lab.runs.gpu_package", "--src", "missing.tar.gz", "--site", str(other), "--work", str(work),
                             "--from", str(parts))
    assert unpacked.returncode == 0, unpacked.stdout + unpacked.stderr
    record = json.loads((work / "results" / "build-package.json").read_text())
    assert record["unpacked_from"] == ["pkg-build.tar.xz.00"] and record["python_files"] == 0  # the parts hold this code
    assert (other / "pyllm_a100" / "serve" / "server.py").is_file()
    assert (other / "pyllm_a100" / "_native" / "libggml-cuda.so").read_bytes() == bytes(range(256)) * 4096
    (parts / "pkg-build.sha256").write_text("0" * 64 + "\n")
    bad = fakes.program("lab.runs.gpu_package", "--src", "missing.tar.gz", "--site", str(tmp_path / "third"),
                        "--work", str(work), "--from", str(parts))
    assert bad.returncode == 1 and "do not add up" in json.loads((work / "results" / "build-package.json").read_text())["error"]

