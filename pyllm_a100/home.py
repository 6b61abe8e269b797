"""``$PYLLM_HOME`` and the files under it: private folders (0700) and files (0600), atomic JSON, secrets.

Everything the package keeps on disk (servers' state and logs, fetched models, manifests, caches)
lives under ``$PYLLM_HOME`` (default ``~/.cache/pyllm-a100``) and is written through these helpers:
a JSON file is replaced atomically (temporary file, fsync, rename), a secret is 0600 from creation.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from .errors import StateError

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def home() -> Path:
    """``$PYLLM_HOME`` (default ``~/.cache/pyllm-a100``); refused when it (or a parent) is not a folder."""
    raw = os.environ.get("PYLLM_HOME")
    path = Path(raw or Path.home() / ".cache" / "pyllm-a100").expanduser()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        where = "PYLLM_HOME" if raw else "the default state folder"
        what = "is a file" if probe == path else f"is under {probe}, which is a file"
        raise StateError(f"{where} {path} {what}, not a folder: point PYLLM_HOME at a folder (or unset it to use ~/.cache/pyllm-a100)")
    return path


def servers_dir() -> Path:
    """Where managed servers and workers keep their folders: ``$PYLLM_HOME/servers``."""
    return home() / "servers"


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) as 0700; an existing folder of ours is narrowed to 0700."""
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    try:
        for folder in reversed(missing):
            folder.mkdir(mode=PRIVATE_DIR, exist_ok=True)
            os.chmod(folder, PRIVATE_DIR)  # mkdir's mode passes through the umask
        if path.stat().st_mode & 0o077 and path.stat().st_uid == os.getuid():
            os.chmod(path, PRIVATE_DIR)
    except NotADirectoryError as exc:
        raise StateError(f"cannot create {path}: a part of it is a file, not a folder ({exc.filename}); point PYLLM_HOME at a folder") from exc
    except OSError as exc:
        raise StateError(f"cannot create {path} ({exc.strerror}): make it writable, or point PYLLM_HOME at a writable folder") from exc
    return path


def open_private(path: Path, mode: str = "ab"):
    """Open a file that is created 0600 (logs and events hold prompts and errors)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, PRIVATE_FILE), mode, buffering=0 if "b" in mode else -1)


def append_line(path: Path, text: str) -> None:
    with open_private(path, "a") as f:
        f.write(text.rstrip("\n") + "\n")


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` in one rename (readers never see half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n", mode)


def write_secret(path: Path, text: str) -> Path:
    """A file only its owner can read (mode 0600 from creation, not chmod afterwards), replaced atomically."""
    write_text_atomic(path, text + "\n", PRIVATE_FILE)
    return path


