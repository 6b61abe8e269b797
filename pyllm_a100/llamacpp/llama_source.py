"""Obtain the llama.cpp source tree that pyllm-a100 compiles.

Two callers: CMake runs this file by path at configure time (so it uses the standard
library only and imports nothing from the package), and ``pyllm vendor pack`` imports
it to write an offline archive. Sources, first match wins:

1. an explicit source (``PYLLM_LLAMA_CPP_SOURCE``): a source tree (any fork or branch)
   or an archive (``pyllm vendor pack`` output, the pinned sdist, a GitHub tarball);
2. ``vendor/llama.cpp``, populated earlier (git-ignored);
3. ``pip download`` of the pinned llama-cpp-python sdist, sha256-checked, of which only
   the llama.cpp tree is extracted. Going through pip keeps index/mirror settings working.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

MARKER = ".pyllm-source.json"
# Top-level folders of the llama.cpp tree the build never reads (~110 MB of ~125 MB);
# models/templates (the chat templates, ~0.6 MB) is kept: synthetic models embed one.
TRIMMED_DIRS = frozenset({"models", "docs", "media", ".github", "benches"})
KEPT_UNDER_TRIMMED = frozenset({("models", "templates")})
# Bumped when what an extraction keeps changes, so vendor/llama.cpp is re-extracted.
LAYOUT = 2
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.xz", ".tar.bz2")


class SourceError(Exception):
    """A source could not be obtained; the message says what is wrong and what to do."""


class ChecksumMismatch(SourceError):
    """The downloaded sdist is not the pinned file: nothing was extracted."""


@dataclasses.dataclass(frozen=True)
class Pin:
    distribution: str
    version: str
    sdist: str
    sha256: str
    llama_cpp_commit: str
    upstream: str = "ggml-org/llama.cpp"
    llama_h_sha256: str = ""

    @classmethod
    def load(cls, path: Path) -> Pin:
        return cls(**json.loads(Path(path).read_text()))

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclasses.dataclass(frozen=True)
class Patch:
    path: Path

    @property
    def sha256(self) -> str:
        return sha256_of(self.path)

    def describe(self) -> dict:
        return {"name": self.path.name, "sha256": self.sha256}


@dataclasses.dataclass(frozen=True)
class ResolvedSource:
    """The tree to build and what build info says about it."""

    tree: Path
    kind: str  # "pinned" | "tree" | "archive"
    label: str  # "pinned" or the user's path
    commit: str
    patches: tuple[str, ...]

    def cmake_lines(self) -> str:
        def q(value: str) -> str:
            return '"' + value.replace("\\", "/").replace('"', '\\"') + '"'

        return "".join(
            f"set({name} {q(value)})\n"
            for name, value in (
                ("PYLLM_SRC_TREE", str(self.tree)),
                ("PYLLM_SRC_KIND", self.kind),
                ("PYLLM_SRC_LABEL", self.label),
                ("PYLLM_SRC_COMMIT", self.commit),
                ("PYLLM_SRC_PATCHES", ";".join(self.patches)),
            )
        )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def list_patches(patch_dir: Path | None) -> list[Patch]:
    """Our own patches, applied in file-name order (``0001-….patch``)."""
    if patch_dir is None or not Path(patch_dir).is_dir():
        return []
    return [Patch(p) for p in sorted(Path(patch_dir).glob("*.patch"))]


def is_llama_tree(path: Path) -> bool:
    return (path / "CMakeLists.txt").is_file() and (path / "include" / "llama.h").is_file() and (
        path / "ggml" / "CMakeLists.txt"
    ).is_file()


def read_marker(tree: Path) -> dict | None:
    try:
        return json.loads((tree / MARKER).read_text())
    except (OSError, ValueError):
        return None


def git_commit(tree: Path) -> str:
    """Short commit of a git checkout; "unknown" for a tree that is not one (never a parent repo's)."""
    if not (Path(tree) / ".git").exists():
        return "unknown"
    try:
        out = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short=9", "HEAD"],
            capture_output=True, text=True, timeout=20, check=True,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --- archives -------------------------------------------------------------------------


def _tree_prefix(names: list[str]) -> PurePosixPath:
    """The folder inside an archive that holds the llama.cpp tree (shallowest match)."""
    members = {PurePosixPath(n.rstrip("/")) for n in names}
    candidates = sorted(
        (m.parent for m in members if m.name == "llama.h" and m.parent.name == "include"),
        key=lambda p: len(p.parts),
    )
    for include_dir in candidates:
        root = include_dir.parent
        if root / "CMakeLists.txt" in members and root / "ggml" / "CMakeLists.txt" in members:
            return root
    raise SourceError(
        "the archive holds no llama.cpp tree (no include/llama.h beside CMakeLists.txt and "
        "ggml/): pass a llama.cpp source archive, e.g. one written by `pyllm vendor pack`"
    )


def _is_trimmed(rel: PurePosixPath) -> bool:
    if len(rel.parts) == 0 or rel.parts[0] not in TRIMMED_DIRS:
        return False
    return not (len(rel.parts) >= 2 and tuple(rel.parts[:2]) in KEPT_UNDER_TRIMMED) and not (
        len(rel.parts) == 1 and any(rel.parts[0] == kept[0] for kept in KEPT_UNDER_TRIMMED)
    )


# git's variables that would point `git apply` at a repository (a hook or a `git rebase --exec` sets them).
_GIT_REPO_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR",
                       "GIT_NAMESPACE", "GIT_PREFIX")


def _patch_commands(tree: Path, path: Path) -> tuple[list[list[str]], dict | None]:
    """The check and the apply command for one patch (git format-patch output or a plain diff), and their env.

    `git apply` outside a repository: GIT_CEILING_DIRECTORIES stops git's search at the tree, so a repository around
    it (this checkout, for vendor/llama.cpp) is never taken for the tree's own. Like `patch --fuzz=0`, every context
    line must match; the mail header and diffstat of a format-patch file are skipped, new files and renames apply.
    Without git (or for a tree with a .git of its own, which extracted trees never have): `patch`, dry run first.
    """
    git = shutil.which("git")
    if git is not None and not (Path(tree) / ".git").exists():
        env = {k: v for k, v in os.environ.items() if k not in _GIT_REPO_VARIABLES}
        # and no user or system git configuration (core.autocrlf, apply.*) changes what is applied
        env.update(GIT_CEILING_DIRECTORIES=str(Path(tree).resolve().parent), GIT_CONFIG_NOSYSTEM="1",
                   GIT_CONFIG_GLOBAL=os.devnull)
        apply = [git, "apply", "-p1", "--whitespace=nowarn", str(path)]
        return [apply[:2] + ["--check"] + apply[2:], apply], env
    patch = shutil.which("patch")
    if patch is None:
        raise SourceError(f"applying {path.name} needs git (or the `patch` program): install it (apt install git)")
    apply = [patch, "-p1", "--forward", "--batch", "--fuzz=0", "-i", str(path)]
    return [apply[:1] + ["--dry-run"] + apply[1:], apply], None


def _apply_patches(tree: Path, patches: list[Patch]) -> None:
    """Apply ``patches`` to ``tree`` in order; each is checked first, so a patch that fails changes nothing."""
    for patch in patches:
        commands, env = _patch_commands(tree, patch.path.resolve())
        for command in commands:
            result = subprocess.run(command, cwd=tree, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                first = (result.stdout + result.stderr).strip().splitlines()[:3]
                raise SourceError(
                    f"patch {patch.path.name} does not apply to this llama.cpp tree ({' / '.join(first)}): "
                    "refresh the patch for the pinned source (vendor/sync import DIR, fix it there with git rebase -i, "
                    "vendor/sync export DIR), or remove it from vendor/patches"
                )


def extract_tree(archive: Path, dest: Path, *, patches: list[Patch], marker: dict) -> Path:
    """Extract the llama.cpp tree of ``archive`` into ``dest`` atomically.

    Trimmed folders are skipped, ``patches`` applied, a marker written; only then is the
    temporary folder renamed to ``dest``. On any error nothing is left at ``dest``.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".incomplete-", dir=dest.parent))
    try:
        with tarfile.open(archive) as tar:
            prefix = _tree_prefix(tar.getnames())
            members = []
            for member in tar.getmembers():
                path = PurePosixPath(member.name.rstrip("/"))
                try:
                    rel = path.relative_to(prefix)
                except ValueError:
                    continue
                if rel == PurePosixPath(".") or _is_trimmed(rel) or ".git" in rel.parts:
                    continue
                member.name = str(rel)
                members.append(member)
            extract_kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp, members=members, **extract_kwargs)
        _apply_patches(tmp, patches)
        marker = dict(marker, patches=[p.describe() for p in patches])
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        tmp.chmod(0o755)
        _keep_times_of_unchanged(tmp, dest)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        return dest
    except tarfile.TarError as exc:
        raise SourceError(f"{archive} is not a readable tar archive ({exc}): pass a .tar.gz of a llama.cpp tree") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _keep_times_of_unchanged(new: Path, old: Path) -> None:
    """Files of ``new`` identical to those of ``old`` (the tree it replaces) take their modification times, so the
    build after a change of the patches recompiles what the change touched, not the whole tree."""
    if not old.is_dir():
        return
    for path in new.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        before = old / path.relative_to(new)
        try:
            was = before.stat()
            if was.st_size == path.stat().st_size and before.read_bytes() == path.read_bytes():
                os.utime(path, ns=(was.st_atime_ns, was.st_mtime_ns))
        except OSError:
            continue


# The web UI's sources (SvelteKit) and where its built assets go: llama.cpp's scripts/ui-assets.cmake
# embeds a tools/ui/dist it finds in the source tree as it is, with no npm (its first choice).
UI_DIR = PurePosixPath("tools/ui")
UI_DIST = UI_DIR / "dist"
# npm's and SvelteKit's work folders inside tools/ui: never packed.
UI_SCRATCH = frozenset({"node_modules", ".svelte-kit"})


def build_ui(tree: Path, work: Path, *, log=None) -> Path:
    """Build ``tree``'s web UI (tools/ui) with npm in a copy under ``work``; return the assets folder.

    ``npm ci`` reads the npm registry (the user's npm settings apply); ``npm run build`` writes the
    assets llama-server embeds. ``tree`` itself is never written to.
    """
    src = Path(tree) / UI_DIR
    if not (src / "package.json").is_file():
        raise SourceError(f"{src} does not exist: this llama.cpp tree has no web UI to build (tools/ui)")
    npm = shutil.which("npm")
    if npm is None:
        raise SourceError("--with-ui builds the web UI with npm, which is not installed: install nodejs and npm "
                          "(apt install nodejs npm), or pack without --with-ui")
    stage = Path(work) / "ui"
    shutil.copytree(src, stage, ignore=shutil.ignore_patterns(*UI_SCRATCH, "dist"))
    dist = Path(work) / "ui-dist"
    env = dict(os.environ, LLAMA_UI_OUT_DIR=str(dist), LLAMA_BUILD_NUMBER="0", LLAMA_UI_VERSION="b0")
    for step in (["ci", "--no-audit", "--no-fund"], ["run", "build"]):
        if log is not None:
            log(f"web UI: npm {' '.join(step)} in {stage}")
        result = subprocess.run([npm, *step], cwd=stage, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            tail = " / ".join((result.stdout + result.stderr).strip().splitlines()[-3:])
            raise SourceError(f"`npm {' '.join(step)}` for the web UI failed ({result.returncode}: {tail}): check "
                              "that the npm registry is reachable (npm config get registry), or pack without --with-ui")
    if not (dist / "index.html").is_file():
        raise SourceError(f"npm run build wrote no index.html into {dist}: the web UI of this tree did not build")
    return dist


def pack(source: Path, out: Path, *, marker: dict, with_ui: bool = False, log=None) -> Path:
    """Write a trimmed ``llama.cpp/`` tree from a tree or archive to ``out`` (tar.gz), atomically.

    ``with_ui``: also build the tree's web UI with npm (:func:`build_ui`) and put the assets in as
    ``tools/ui/dist``, which a build from the archive embeds without npm. Our patches are applied at
    build time, after the UI was built; none of them touches tools/ui.
    """
    source, out = Path(source), Path(out)
    if not out.name.endswith((".tar.gz", ".tgz")):
        raise SourceError(f"{out}: the archive name must end in .tar.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".pack-") as work:
        if source.is_dir():
            tree = source
            if not is_llama_tree(tree):
                raise SourceError(f"{tree} is not a llama.cpp source tree (no include/llama.h): pass the tree's root folder")
        else:
            tree = extract_tree(source, Path(work) / "llama.cpp", patches=[], marker=marker)
        ui_dist = build_ui(tree, Path(work), log=log) if with_ui else None
        partial = out.with_name(out.name + ".incomplete")

        def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            rel = PurePosixPath(info.name).relative_to("llama.cpp")
            if _is_trimmed(rel) or ".git" in rel.parts or rel.name == MARKER:
                return None
            if rel.parts[:2] == UI_DIR.parts and (
                UI_SCRATCH.intersection(rel.parts[2:3]) or (ui_dist is not None and rel.parts[2:3] == ("dist",))
            ):
                return None  # npm's work folders; with_ui: the tree's own dist is replaced by the fresh build
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            return info

        def keep_dist(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            return info

        with tarfile.open(partial, "w:gz") as tar:
            tar.add(tree, arcname="llama.cpp", filter=keep)
            if ui_dist is not None:
                tar.add(ui_dist, arcname=f"llama.cpp/{UI_DIST}", filter=keep_dist)
            data = (json.dumps(dict(marker, patches=[]), indent=2) + "\n").encode()
            info = tarfile.TarInfo(f"llama.cpp/{MARKER}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        os.replace(partial, out)
    return out


# --- the pinned sdist through pip -------------------------------------------------------


def download_sdist(pin: Pin, dest_dir: Path) -> Path:
    """``pip download`` the pinned sdist into ``dest_dir`` and verify its sha256.

    pip reads the user's index settings (``PIP_INDEX_URL``, pip.conf, mirrors). A file
    that does not match the pin is deleted and :class:`ChecksumMismatch` raised.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / pin.sdist
    if final.exists() and sha256_of(final) == pin.sha256:
        return final
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".download-") as work:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", pin.distribution,
               pin.requirement, "-d", work]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            tail = " / ".join(result.stderr.strip().splitlines()[-2:])
            raise SourceError(
                f"`pip download {pin.requirement}` failed ({tail}): check your package index or "
                "mirror settings, or build offline from an archive made elsewhere with `pyllm vendor "
                "pack OUT.tar.gz` (pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE=OUT.tar.gz .)"
            )
        got = Path(work) / pin.sdist
        if not got.exists():
            found = ", ".join(p.name for p in Path(work).iterdir()) or "nothing"
            raise SourceError(f"pip download gave {found}, not {pin.sdist}: the index serves another file name for {pin.requirement}")
        digest = sha256_of(got)
        if digest != pin.sha256:
            raise ChecksumMismatch(
                f"{pin.sdist} from your package index has sha256 {digest}, but the pin "
                f"(vendor/pin.json) says {pin.sha256}: nothing was extracted. Your index or mirror "
                "serves a different file; fix the mirror, or build from a verified archive "
                "(PYLLM_LLAMA_CPP_SOURCE=OUT.tar.gz written by `pyllm vendor pack` on a trusted machine)"
            )
        os.replace(got, final)
    return final


def describe(source: Path, pin: Pin) -> dict:
    """The marker to pack with ``source``: its own marker, the pin's, or where it came from."""
    source = Path(source)
    if source.is_dir():
        return read_marker(source) or {"origin": str(source.resolve()), "llama_cpp_commit": git_commit(source)}
    if sha256_of(source) == pin.sha256:
        return pin_marker(pin)
    with tarfile.open(source) as tar:
        return _archive_marker(tar) or {"origin": str(source.resolve()), "llama_cpp_commit": "unknown"}


def pin_marker(pin: Pin) -> dict:
    return {"origin": f"{pin.requirement} sdist", "sha256": pin.sha256, "llama_cpp_commit": pin.llama_cpp_commit,
            "layout": LAYOUT}


# --- resolution -------------------------------------------------------------------------


def _patch_fingerprint(patches: list[Patch]) -> list[dict]:
    return [p.describe() for p in patches]


def _is_pin_marker(marker: dict | None, pin: Pin) -> bool:
    return bool(marker) and marker.get("sha256") == pin.sha256


def resolve(
    explicit: str | None,
    *,
    pin: Pin,
    vendor_dir: Path,
    work_dir: Path,
    patch_dir: Path | None = None,
) -> ResolvedSource:
    """Return the llama.cpp tree to build, obtaining it if needed (see module docstring)."""
    patches = list_patches(patch_dir)
    vendor_tree = Path(vendor_dir) / "llama.cpp"

    if explicit:
        source = Path(explicit).expanduser()
        if not source.exists():
            raise SourceError(
                f"PYLLM_LLAMA_CPP_SOURCE={explicit} does not exist: give a llama.cpp source tree or a .tar.gz archive"
            )
        source = source.resolve()
        if source.is_dir():
            if not is_llama_tree(source):
                raise SourceError(
                    f"PYLLM_LLAMA_CPP_SOURCE={source} is not a llama.cpp source tree (no include/llama.h "
                    "and ggml/): point it at the root of the checkout"
                )
            return ResolvedSource(source, "tree", str(source), git_commit(source), ())
        if not source.name.endswith(ARCHIVE_SUFFIXES):
            raise SourceError(f"PYLLM_LLAMA_CPP_SOURCE={source} is neither a folder nor a .tar.gz archive")
        digest = sha256_of(source)
        is_pin_sdist = digest == pin.sha256
        with tarfile.open(source) as tar:
            marker = _archive_marker(tar)
        from_pin = is_pin_sdist or _is_pin_marker(marker, pin)
        applied = patches if from_pin else []
        key = hashlib.sha256((digest + json.dumps(_patch_fingerprint(applied))).encode()).hexdigest()[:16]
        dest = Path(work_dir) / f"llama.cpp-{key}"
        if read_marker(dest) is None:
            base_marker = pin_marker(pin) if is_pin_sdist else (marker or {"origin": str(source)})
            extract_tree(source, dest, patches=applied, marker=base_marker)
        commit = (read_marker(dest) or {}).get("llama_cpp_commit", "unknown")
        return ResolvedSource(dest, "archive", str(source), commit, tuple(p.path.name for p in applied))

    marker = read_marker(vendor_tree) if vendor_tree.is_dir() else None
    if vendor_tree.is_dir() and not _is_pin_marker(marker, pin):
        if not is_llama_tree(vendor_tree):
            raise SourceError(f"{vendor_tree} exists but is not a llama.cpp tree: delete it to fetch the pinned source")
        return ResolvedSource(vendor_tree, "tree", str(vendor_tree), git_commit(vendor_tree), ())
    if marker is None or marker.get("patches", []) != _patch_fingerprint(patches) or marker.get("layout") != LAYOUT:
        sdist = download_sdist(pin, Path(vendor_dir) / "downloads")
        extract_tree(sdist, vendor_tree, patches=patches, marker=pin_marker(pin))
    return ResolvedSource(vendor_tree, "pinned", "pinned", pin.llama_cpp_commit, tuple(p.path.name for p in patches))


def _archive_marker(tar: tarfile.TarFile) -> dict | None:
    for member in tar.getmembers():
        if PurePosixPath(member.name).name == MARKER and len(PurePosixPath(member.name).parts) <= 2:
            f = tar.extractfile(member)
            if f is not None:
                try:
                    return json.loads(f.read())
                except ValueError:
                    return None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Obtain the llama.cpp tree for the pyllm-a100 build (run by CMake).")
    parser.add_argument("--source", default="", help="explicit source tree or archive (PYLLM_LLAMA_CPP_SOURCE)")
    parser.add_argument("--pin", required=True, type=Path)
    parser.add_argument("--vendor-dir", required=True, type=Path)
    parser.add_argument("--work-dir", required=True, type=Path)
    parser.add_argument("--patch-dir", type=Path)
    parser.add_argument("--cmake-out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        resolved = resolve(
            args.source.strip() or None,
            pin=Pin.load(args.pin),
            vendor_dir=args.vendor_dir,
            work_dir=args.work_dir,
            patch_dir=args.patch_dir,
        )
    except SourceError as exc:
        print(f"pyllm-a100: {exc}", file=sys.stderr)
        return 1
    args.cmake_out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.cmake_out.with_name(args.cmake_out.name + ".incomplete")
    partial.write_text(resolved.cmake_lines())
    os.replace(partial, args.cmake_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
