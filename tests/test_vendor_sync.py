"""vendor/sync on a stand-in pin: import makes one commit per patch, export gives the files back byte for byte and
renumbers after an edit, check names the patch that does not apply."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="vendor/sync needs git")

PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: pyllm-a100 <pyllm-a100@users.noreply.github.com>
Date: Thu, 1 Jan 2026 00:00:00 +0000
Subject: [PATCH] llama: mark the header

pyllm-a100 patch: a stand-in.
---
 include/llama.h | 1 +
 1 file changed, 1 insertion(+)

diff --git a/include/llama.h b/include/llama.h
index 477154a1d1b2..08b62cfcc89d 100644
--- a/include/llama.h
+++ b/include/llama.h
@@ -1 +1,2 @@
 // llama.h of a tiny stand-in tree
+// patched by pyllm-a100
"""


@pytest.fixture
def sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """vendor/sync with its pin and patch folder pointed at a stand-in sdist (the three files of a llama.cpp tree)."""
    top = tmp_path / "sdist" / "llama_cpp_python-0.0.1" / "vendor" / "llama.cpp"
    (top / "include").mkdir(parents=True)
    (top / "ggml").mkdir()
    (top / "docs").mkdir()
    (top / "CMakeLists.txt").write_text("project(stand_in)\n")
    (top / "include" / "llama.h").write_text("// llama.h of a tiny stand-in tree\n")
    (top / "ggml" / "CMakeLists.txt").write_text("# ggml\n")
    (top / "docs" / "trimmed.md").write_text("not extracted\n")
    (top / ".gitignore").write_text("*.h\n")  # the pin's own ignore rules must not drop files from the base commit
    sdist = tmp_path / "llama_cpp_python-0.0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "sdist" / "llama_cpp_python-0.0.1", arcname="llama_cpp_python-0.0.1")
    pin = tmp_path / "pin.json"
    pin.write_text(json.dumps({"distribution": "llama-cpp-python", "version": "0.0.1", "sdist": sdist.name,
                               "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
                               "llama_cpp_commit": "abc123def"}))
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-llama-mark-the-header.patch").write_text(PATCH)
    loader = importlib.machinery.SourceFileLoader("vendor_sync", str(REPO / "vendor" / "sync"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    monkeypatch.setattr(module, "PIN_FILE", pin)
    monkeypatch.setattr(module, "PATCH_DIR", patches)
    module.test_sdist = str(sdist)
    return module


def test_import_then_export_gives_the_same_files(sync, tmp_path: Path) -> None:
    series = tmp_path / "series"
    assert sync.main(["import", str(series), "--sdist", sync.test_sdist]) == 0
    log = subprocess.run(["git", "-C", str(series), "log", "--format=%s", "pin..HEAD"], capture_output=True, text=True)
    assert log.stdout.split("\n")[0] == "llama: mark the header"
    assert (series / ".gitignore").is_file() and not (series / "docs").exists()
    before = {p.name: p.read_bytes() for p in sync.PATCH_DIR.iterdir()}
    assert sync.main(["export", str(series)]) == 0
    assert {p.name: p.read_bytes() for p in sync.PATCH_DIR.iterdir()} == before


def test_export_numbers_a_new_commit_and_fixes_author_and_date(sync, tmp_path: Path) -> None:
    series = tmp_path / "series"
    sync.main(["import", str(series), "--sdist", sync.test_sdist])
    (series / "ggml" / "CMakeLists.txt").write_text("# ggml, patched\n")
    subprocess.run(["git", "-C", str(series), "-c", "user.name=Someone", "-c", "user.email=s@example.org",
                    "commit", "-qam", "ggml: a second patch"], check=True)
    assert sync.main(["export", str(series)]) == 0
    names = sorted(p.name for p in sync.PATCH_DIR.iterdir())
    assert names == ["0001-llama-mark-the-header.patch", "0002-ggml-a-second-patch.patch"]
    second = (sync.PATCH_DIR / names[1]).read_text()
    assert "From: pyllm-a100 <pyllm-a100@users.noreply.github.com>\nDate: Thu, 1 Jan 2026 00:00:00 +0000\n" in second
    assert sync.main(["check", "--sdist", sync.test_sdist]) == 0


def test_check_names_the_patch_that_does_not_apply(sync, capsys: pytest.CaptureFixture) -> None:
    (sync.PATCH_DIR / "0002-bad.patch").write_text(PATCH.replace("tiny stand-in", "other"))
    assert sync.main(["check", "--sdist", sync.test_sdist]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0002-bad.patch does not apply" in err[0]


def test_check_wants_contiguous_numbers(sync, capsys: pytest.CaptureFixture) -> None:
    (sync.PATCH_DIR / "0003-gap.patch").write_text(PATCH)
    assert sync.main(["check", "--sdist", sync.test_sdist]) == 1
    assert "without gaps" in capsys.readouterr().err
