"""Obtaining the llama.cpp source: pip with the user's index settings, sha256, patches, packs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from pyllm_a100.llamacpp import llama_source
from pyllm_a100.llamacpp.llama_source import ChecksumMismatch, Pin, SourceError

from conftest import REPO, run_pyllm

FAKE_VERSION = "0.3.36"
PATCH = textwrap.dedent(
    """\
    --- a/include/llama.h
    +++ b/include/llama.h
    @@ -1 +1,2 @@
     // llama.h of a tiny stand-in tree
    +// patched by pyllm-a100
    """
)

# vendor/patches holds git format-patch output (vendor/sync export): a mail header, the message, a diffstat, the diff.
FORMAT_PATCH = textwrap.dedent(
    """\
    From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
    From: pyllm-a100 <pyllm-a100@users.noreply.github.com>
    Date: Thu, 1 Jan 2026 00:00:00 +0000
    Subject: [PATCH] llama: mark the header

    A stand-in patch in git format-patch form: the mail header, this text and the diffstat come before the diff.
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
)
NEW_FILE_PATCH = textwrap.dedent(
    """\
    From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
    From: pyllm-a100 <pyllm-a100@users.noreply.github.com>
    Date: Thu, 1 Jan 2026 00:00:00 +0000
    Subject: [PATCH] src: a new file

    ---
     src/added.c | 1 +
     1 file changed, 1 insertion(+)
     create mode 100644 src/added.c

    diff --git a/src/added.c b/src/added.c
    new file mode 100644
    index 000000000000..9a850cfc0412
    --- /dev/null
    +++ b/src/added.c
    @@ -0,0 +1 @@
    +int added(void) { return 1; }
    """
)
RENAME_PATCH = textwrap.dedent(
    """\
    From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
    From: pyllm-a100 <pyllm-a100@users.noreply.github.com>
    Date: Thu, 1 Jan 2026 00:00:00 +0000
    Subject: [PATCH] ggml: a renamed file

    ---
     ggml/{CMakeLists.txt => renamed.txt} | 0
     1 file changed, 0 insertions(+), 0 deletions(-)
     rename ggml/{CMakeLists.txt => renamed.txt} (100%)

    diff --git a/ggml/CMakeLists.txt b/ggml/renamed.txt
    similarity index 100%
    rename from ggml/CMakeLists.txt
    rename to ggml/renamed.txt
    """
)
# Two files: the first hunk applies, the second does not (its context is not in the tree).
HALF_PATCH = FORMAT_PATCH.replace("Subject: [PATCH] llama: mark the header", "Subject: [PATCH] two files") + textwrap.dedent(
    """\
    diff --git a/CMakeLists.txt b/CMakeLists.txt
    index 111111111111..222222222222 100644
    --- a/CMakeLists.txt
    +++ b/CMakeLists.txt
    @@ -1 +1,2 @@
     project(another_tree)
    +# patched by pyllm-a100
    """
)


@pytest.fixture(params=["git", "patch"])
def applier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Patches apply with `git apply`, or with `patch` where git is not installed."""
    if request.param == "patch":
        which = llama_source.shutil.which
        monkeypatch.setattr(llama_source.shutil, "which", lambda name: None if name == "git" else which(name))
        if which("patch") is None:
            pytest.skip("the patch program is not installed")
    elif llama_source.shutil.which("git") is None:
        pytest.skip("git is not installed")
    return request.param


def _tiny_tree(root: Path) -> Path:
    """The three files that make a folder look like a llama.cpp tree, plus a trimmed folder."""
    (root / "include").mkdir(parents=True)
    (root / "ggml").mkdir()
    (root / "docs").mkdir()
    (root / "CMakeLists.txt").write_text("project(stand_in)\n")
    (root / "include" / "llama.h").write_text("// llama.h of a tiny stand-in tree\n")
    (root / "ggml" / "CMakeLists.txt").write_text("# ggml\n")
    (root / "docs" / "big.md").write_text("trimmed\n" * 1000)
    (root / ".git").write_text("gitdir: ../../.git/modules/vendor/llama.cpp\n")
    return root


@pytest.fixture
def find_links(tmp_path: Path) -> Path:
    """A local package index holding a stand-in llama-cpp-python sdist that pip can download offline.

    Its build backend lives in the sdist itself, so pip prepares metadata without fetching anything.
    """
    top = tmp_path / "sdist" / f"llama_cpp_python-{FAKE_VERSION}"
    _tiny_tree(top / "vendor" / "llama.cpp")
    (top / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
    )
    (top / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: llama-cpp-python\nVersion: {FAKE_VERSION}\n")
    (top / "backend.py").write_text(
        textwrap.dedent(
            f"""\
            import os
            def get_requires_for_build_wheel(config_settings=None):
                return []
            def prepare_metadata_for_build_wheel(directory, config_settings=None):
                name = "llama_cpp_python-{FAKE_VERSION}.dist-info"
                os.makedirs(os.path.join(directory, name))
                with open(os.path.join(directory, name, "METADATA"), "w") as f:
                    f.write("Metadata-Version: 2.1\\nName: llama-cpp-python\\nVersion: {FAKE_VERSION}\\n")
                return name
            def build_wheel(*args, **kwargs):
                raise RuntimeError("not for installing")
            """
        )
    )
    links = tmp_path / "links"
    links.mkdir()
    with tarfile.open(links / f"llama_cpp_python-{FAKE_VERSION}.tar.gz", "w:gz") as tar:
        tar.add(top, arcname=top.name)
    return links


@pytest.fixture
def pip_uses(find_links: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point pip at the local index the way a user points it at a mirror: environment settings only."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(find_links))
    return find_links / f"llama_cpp_python-{FAKE_VERSION}.tar.gz"


def _pin(sha256: str) -> Pin:
    return Pin(
        distribution="llama-cpp-python",
        version=FAKE_VERSION,
        sdist=f"llama_cpp_python-{FAKE_VERSION}.tar.gz",
        sha256=sha256,
        llama_cpp_commit="abc123def",
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pip_download_honours_index_settings_and_extracts_only_the_tree(pip_uses: Path, tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    resolved = llama_source.resolve(None, pin=_pin(_sha(pip_uses)), vendor_dir=vendor, work_dir=tmp_path / "work")
    tree = vendor / "llama.cpp"
    assert resolved.tree == tree and resolved.kind == "pinned" and resolved.commit == "abc123def"
    assert (tree / "include" / "llama.h").is_file()
    assert not (tree / "docs").exists(), "trimmed folders must not be extracted"
    assert not (tree / ".git").exists(), "the sdist's submodule link must not be extracted"
    assert not (tree / "pyproject.toml").exists(), "only the llama.cpp tree of the sdist is extracted"


def test_checksum_mismatch_stops_and_extracts_nothing(pip_uses: Path, tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    pin_file = tmp_path / "pin.json"
    real_pin = Pin.load(REPO / "vendor" / "pin.json")
    pin_file.write_text((REPO / "vendor" / "pin.json").read_text())
    # The stand-in sdist has the pinned name and version but not the pinned bytes.
    assert _sha(pip_uses) != real_pin.sha256
    script = Path(llama_source.__file__)
    result = subprocess.run(
        [sys.executable, str(script), "--pin", str(pin_file), "--vendor-dir", str(vendor),
         "--work-dir", str(tmp_path / "work"), "--cmake-out", str(tmp_path / "out.cmake")],
        capture_output=True, text=True,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "sha256" in lines[0] and real_pin.sha256 in lines[0]
    assert "nothing was extracted" in lines[0]
    assert not (vendor / "llama.cpp").exists()
    assert not (vendor / "downloads" / real_pin.sdist).exists(), "a mismatched download must not be kept"
    assert not (tmp_path / "out.cmake").exists()


def test_checksum_mismatch_is_a_typed_error(pip_uses: Path, tmp_path: Path) -> None:
    with pytest.raises(ChecksumMismatch):
        llama_source.download_sdist(_pin("0" * 64), tmp_path / "downloads")


def test_patches_apply_in_order_to_the_pinned_source(pip_uses: Path, tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-mark.patch").write_text(PATCH)
    (patches / "0002-src-a-new-file.patch").write_text(NEW_FILE_PATCH)
    resolved = llama_source.resolve(
        str(pip_uses), pin=_pin(_sha(pip_uses)), vendor_dir=tmp_path / "vendor",
        work_dir=tmp_path / "work", patch_dir=patches,
    )
    assert resolved.kind == "archive" and resolved.patches == ("0001-mark.patch", "0002-src-a-new-file.patch")
    assert "patched by pyllm-a100" in (resolved.tree / "include" / "llama.h").read_text()
    assert (resolved.tree / "src" / "added.c").is_file()
    marker = llama_source.read_marker(resolved.tree)
    assert [p["name"] for p in marker["patches"]] == ["0001-mark.patch", "0002-src-a-new-file.patch"]


def test_a_new_patch_set_keeps_the_times_of_the_files_it_does_not_change(pip_uses: Path, tmp_path: Path) -> None:
    """vendor/llama.cpp is re-extracted when the patches change: files the change does not touch keep their old
    modification times, so the next build recompiles only the patched files (not the whole tree)."""
    import os

    patches = tmp_path / "patches"
    patches.mkdir()
    vendor = tmp_path / "vendor"
    pin = _pin(_sha(pip_uses))
    tree = llama_source.resolve(None, pin=pin, vendor_dir=vendor, work_dir=tmp_path / "work", patch_dir=patches).tree
    old = 1_000_000_000
    for path in tree.rglob("*"):
        if path.is_file():
            os.utime(path, (old, old))
    (patches / "0001-mark.patch").write_text(PATCH)
    again = llama_source.resolve(None, pin=pin, vendor_dir=vendor, work_dir=tmp_path / "work", patch_dir=patches).tree
    assert again == tree and "patched by pyllm-a100" in (tree / "include" / "llama.h").read_text()
    assert (tree / "include" / "llama.h").stat().st_mtime > old, "the patched file is new to the build"
    kept = [p for p in tree.rglob("*") if p.is_file() and p.name != "llama.h" and p.name != llama_source.MARKER]
    assert kept and all(p.stat().st_mtime == old for p in kept), "untouched files keep their times"


def test_a_patch_that_does_not_apply_leaves_nothing(pip_uses: Path, tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-bad.patch").write_text(PATCH.replace("tiny stand-in", "other"))
    work = tmp_path / "work"
    with pytest.raises(SourceError, match="does not apply"):
        llama_source.resolve(
            str(pip_uses), pin=_pin(_sha(pip_uses)), vendor_dir=tmp_path / "vendor", work_dir=work, patch_dir=patches
        )
    assert not work.exists() or not any(work.iterdir())


def _patch_files(folder: Path, texts: dict[str, str]) -> list[llama_source.Patch]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_text(text)
    return llama_source.list_patches(folder)


def _extracted_tree(root: Path) -> Path:
    """A tiny tree as extract_tree leaves it before patching: no .git."""
    tree = _tiny_tree(root)
    (tree / ".git").unlink()
    return tree


def test_format_patch_files_apply_new_files_and_renames_too(applier: str, tmp_path: Path) -> None:
    tree = _extracted_tree(tmp_path / "tree")
    patches = _patch_files(tmp_path / "patches", {"0001-llama-mark-the-header.patch": FORMAT_PATCH,
                                                   "0002-src-a-new-file.patch": NEW_FILE_PATCH,
                                                   "0003-ggml-a-renamed-file.patch": RENAME_PATCH})
    llama_source._apply_patches(tree, patches)
    assert (tree / "include" / "llama.h").read_text().endswith("// patched by pyllm-a100\n")
    assert (tree / "src" / "added.c").read_text() == "int added(void) { return 1; }\n"
    assert (tree / "ggml" / "renamed.txt").read_text() == "# ggml\n" and not (tree / "ggml" / "CMakeLists.txt").exists()


def test_a_tree_inside_another_git_repository_is_patched_itself(tmp_path: Path) -> None:
    """As vendor/llama.cpp inside this checkout: `git apply` run in a subfolder of a repository would take the paths
    as the repository's and skip them (exit 0, nothing applied) unless git's search stops at the tree."""
    if llama_source.shutil.which("git") is None:
        pytest.skip("git is not installed")
    outer = tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    tree = _extracted_tree(outer / "vendor" / "llama.cpp")
    llama_source._apply_patches(tree, _patch_files(tmp_path / "patches", {"0001-mark.patch": FORMAT_PATCH}))
    assert (tree / "include" / "llama.h").read_text().endswith("// patched by pyllm-a100\n")


def test_a_patch_that_does_not_apply_changes_nothing_and_says_which(applier: str, tmp_path: Path) -> None:
    tree = _extracted_tree(tmp_path / "tree")
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    patches = _patch_files(tmp_path / "patches", {"0001-src-a-new-file.patch": NEW_FILE_PATCH,
                                                   "0002-two-files.patch": HALF_PATCH})
    with pytest.raises(SourceError) as err:
        llama_source._apply_patches(tree, patches)
    message = str(err.value)
    assert "\n" not in message and message.startswith("patch 0002-two-files.patch does not apply")
    assert "vendor/sync" in message
    # 0001 applied; 0002's first file, whose hunk alone would apply, is untouched
    assert (tree / "src" / "added.c").is_file()
    after = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file() and p.name != "added.c"}
    assert after == before
    assert not list(tree.rglob("*.rej")) and not list(tree.rglob("*.orig"))


def test_custom_tree_is_used_as_is_with_its_git_commit(tmp_path: Path) -> None:
    tree = _tiny_tree(tmp_path / "fork")
    (tree / ".git").unlink()
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "fork"], check=True
    )
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short=9", "HEAD"], capture_output=True, text=True)
    resolved = llama_source.resolve(
        str(tree), pin=_pin("0" * 64), vendor_dir=tmp_path / "vendor", work_dir=tmp_path / "work",
        patch_dir=REPO / "vendor" / "patches",
    )
    assert resolved.tree == tree.resolve() and resolved.kind == "tree" and resolved.label == str(tree.resolve())
    assert resolved.commit == head.stdout.strip()
    assert resolved.patches == (), "a user's tree is never patched"


@pytest.mark.parametrize(
    "spec, message",
    [("/nonexistent/llama.cpp", "does not exist"), ("NOT_A_TREE", "not a llama.cpp source tree"), ("file.zip", "neither")],
)
def test_bad_explicit_sources_say_what_to_give(tmp_path: Path, spec: str, message: str) -> None:
    if spec == "NOT_A_TREE":
        spec = str(tmp_path)
    elif spec == "file.zip":
        (tmp_path / "file.zip").write_bytes(b"PK")
        spec = str(tmp_path / "file.zip")
    with pytest.raises(SourceError, match=message):
        llama_source.resolve(spec, pin=_pin("0" * 64), vendor_dir=tmp_path / "v", work_dir=tmp_path / "w")


def test_vendor_pack_of_a_tree_is_trimmed_and_rebuildable(tmp_path: Path) -> None:
    tree = _tiny_tree(tmp_path / "tree")
    archive = tmp_path / "out" / "src.tar.gz"
    result = run_pyllm("vendor", "pack", str(archive), "--source", str(tree))
    assert result.returncode == 0, result.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "llama.cpp/include/llama.h" in names
    assert not any(n.startswith("llama.cpp/docs") or "/.git" in n for n in names)
    assert not (tmp_path / "out" / "src.tar.gz.incomplete").exists()
    resolved = llama_source.resolve(str(archive), pin=_pin("0" * 64), vendor_dir=tmp_path / "v", work_dir=tmp_path / "w")
    assert (resolved.tree / "include" / "llama.h").is_file() and resolved.label == str(archive.resolve())


def test_vendor_pack_refuses_a_bad_output_name(tmp_path: Path) -> None:
    result = run_pyllm("vendor", "pack", str(tmp_path / "src.zip"), "--source", str(_tiny_tree(tmp_path / "t")))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and ".tar.gz" in result.stderr
