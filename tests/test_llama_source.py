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

from pyllm_a100.build import llama_source
from pyllm_a100.build.llama_source import ChecksumMismatch, Pin, SourceError

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
    resolved = llama_source.resolve(
        str(pip_uses), pin=_pin(_sha(pip_uses)), vendor_dir=tmp_path / "vendor",
        work_dir=tmp_path / "work", patch_dir=patches,
    )
    assert resolved.kind == "archive" and resolved.patches == ("0001-mark.patch",)
    assert "patched by pyllm-a100" in (resolved.tree / "include" / "llama.h").read_text()
    marker = llama_source.read_marker(resolved.tree)
    assert marker["patches"][0]["name"] == "0001-mark.patch"


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
