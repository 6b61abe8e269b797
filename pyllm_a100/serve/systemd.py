"""`pyllm service`: a systemd unit that runs ``pyllm serve ...`` in the foreground, restarted on failure.

The unit (``/etc/systemd/system/pyllm-NAME.service``, or ``~/.config/systemd/user/`` with ``--user``)
names the pyllm executable and the model by absolute path, sets PYLLM_HOME (so ``pyllm ps`` run by
the same user sees the server), CUDA's JIT cache size and, for ``--gpus``, CUDA_VISIBLE_DEVICES. The
API key never appears in the unit: it is in a 0600 ``EnvironmentFile=`` as PYLLM_API_KEY, which
``pyllm serve`` reads. ``pyllm serve`` exits 78 (EX_CONFIG) for a configuration error, and
``RestartPreventExitStatus=78`` stops systemd from restarting a unit that can never start.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import EX_CONFIG, ServiceError
from ..home import PRIVATE_DIR, write_secret, write_text_atomic

PREFIX = "pyllm-"
SYSTEMD_RUNNING = Path("/run/systemd/system")  # sd_booted(): systemd is PID 1 here
_SAFE = re.compile(r"[A-Za-z0-9_./:=,+@%-]+")


def unit_name(name: str) -> str:
    return f"{PREFIX}{name}.service"


def systemd_running() -> bool:
    return SYSTEMD_RUNNING.is_dir()


@dataclasses.dataclass(frozen=True)
class UnitPaths:
    """Where a unit and its key file go: ``unit``/``env_file`` on the target system, ``*_on_disk`` under --root."""

    name: str
    user: bool
    unit: Path
    env_file: Path
    root: Path | None = None

    def on_disk(self, path: Path) -> Path:
        return path if self.root is None else self.root / path.relative_to(path.anchor)

    @property
    def unit_on_disk(self) -> Path:
        return self.on_disk(self.unit)

    @property
    def env_file_on_disk(self) -> Path:
        return self.on_disk(self.env_file)


def unit_dir(user: bool) -> Path:
    return Path.home() / ".config" / "systemd" / "user" if user else Path("/etc/systemd/system")


def paths(name: str, *, user: bool = False, root: str | os.PathLike[str] | None = None) -> UnitPaths:
    from .state import valid_name

    valid_name(name)
    env_dir = Path.home() / ".config" / "pyllm" if user else Path("/etc/pyllm")
    return UnitPaths(name, user, unit_dir(user) / unit_name(name), env_dir / f"{name}.env",
                     Path(root).absolute() if root is not None else None)


def not_installed(name: str, where: UnitPaths, user: bool) -> ServiceError:
    """The one-line error for a service name with no unit on disk."""
    return ServiceError(f"no pyllm service {name}: {where.unit_on_disk} does not exist (pyllm service list"
                        + ("" if user else "; a user unit needs --user") + ")")


def quote(arg: str) -> str:
    """One ExecStart= word: as is when plain, else double-quoted (systemd.service "Command lines"); ``%`` and
    ``$`` doubled so systemd expands neither specifiers nor variables."""
    arg = arg.replace("%", "%%")
    if _SAFE.fullmatch(arg) and "$" not in arg:
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$").replace("\n", "\\n")
    return f'"{escaped}"'


def env_assignment(name: str, value: str) -> str:
    """``NAME=value`` for Environment= (quoted when it needs to be)."""
    text = f"{name}={value}"
    return quote(text)


def render(name: str, argv: Sequence[str], environment: Mapping[str, str], *, env_file: Path | None, user: bool,
           description: str, run_as: str | None = None) -> str:
    """The unit file's text."""
    lines = [
        f"# Written by `pyllm service install {name}`; remove it with `pyllm service uninstall {name}`"
        + (" --user" if user else "") + ".",
        f"# pyllm serve exits {EX_CONFIG} (EX_CONFIG) for a configuration error: not restarted, see journalctl -u {unit_name(name)}.",
        "[Unit]",
        f"Description={description}",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        *([f"User={run_as}"] if run_as else []),
        "ExecStart=" + " ".join(quote(a) for a in argv),
    ]
    lines += [f"Environment={env_assignment(k, v)}" for k, v in environment.items()]
    if env_file is not None:
        lines.append(f"EnvironmentFile={quote(str(env_file))}")
    lines += [
        "Restart=on-failure",
        "RestartSec=5",
        f"RestartPreventExitStatus={EX_CONFIG}",
        "KillMode=mixed",  # SIGTERM to pyllm serve, which stops llama-server itself; SIGKILL to all after the timeout
        "TimeoutStopSec=60",
        "",
        "[Install]",
        f"WantedBy={'default.target' if user else 'multi-user.target'}",
    ]
    return "\n".join(lines) + "\n"


def key_file_text(api_key: str) -> str:
    if _SAFE.fullmatch(api_key):
        return f"PYLLM_API_KEY={api_key}\n"
    if "'" not in api_key and "\\" not in api_key:
        return f"PYLLM_API_KEY='{api_key}'\n"  # single quotes: systemd takes the value literally
    raise ServiceError("--api-key holds both a quote and a backslash, which an EnvironmentFile cannot carry "
                       "unchanged: use a generated key (leave --api-key out on a non-loopback --host)")


def write(where: UnitPaths, unit_text: str, api_key: str | None) -> None:
    """The unit (0644) and, with a key, its EnvironmentFile (0600 from creation, its folder 0700)."""
    unit = where.unit_on_disk
    try:
        unit.parent.mkdir(parents=True, exist_ok=True)
        if api_key is not None:
            env_file = where.env_file_on_disk
            if not env_file.parent.exists():
                env_file.parent.mkdir(parents=True, mode=PRIVATE_DIR)
                os.chmod(env_file.parent, PRIVATE_DIR)
            write_secret(env_file, key_file_text(api_key).rstrip("\n"))
        write_text_atomic(unit, unit_text, mode=0o644)
    except PermissionError as exc:
        hint = "run it as root (sudo), or install a --user unit" if not where.user else "check that folder's owner"
        raise ServiceError(f"cannot write {exc.filename or unit} (permission denied): {hint}") from exc
    except OSError as exc:
        raise ServiceError(f"cannot write {exc.filename or unit} ({exc.strerror}): check that folder") from exc


def systemctl(user: bool, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["systemctl", *(["--user"] if user else []), *args]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except FileNotFoundError as exc:
        raise ServiceError("systemctl is not on PATH although systemd runs here: install systemd's tools") from exc
    if check and result.returncode != 0:
        why = " ".join((result.stderr or result.stdout).split()) or f"exit {result.returncode}"
        raise ServiceError(f"{shlex.join(argv)} failed: {why}")
    return result


def remove(where: UnitPaths) -> list[Path]:
    """Delete the unit and its key file; the paths removed."""
    gone = []
    for path in (where.unit_on_disk, where.env_file_on_disk):
        try:
            path.unlink()
            gone.append(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ServiceError(f"cannot remove {path} ({exc.strerror}): run it as root (sudo)") from exc
    return gone


def installed(user: bool, root: str | os.PathLike[str] | None = None) -> list[tuple[str, Path]]:
    """(NAME, unit file) for every pyllm-NAME.service in that scope's unit folder."""
    folder = paths("x", user=user, root=root).on_disk(unit_dir(user))
    if not folder.is_dir():
        return []
    return [(p.name[len(PREFIX):-len(".service")], p) for p in sorted(folder.glob(f"{PREFIX}*.service"))]


def exec_start(unit_file: Path) -> list[str]:
    """The ExecStart= words of a unit we wrote (for `pyllm service list`)."""
    for line in unit_file.read_text(errors="replace").splitlines():
        if line.startswith("ExecStart="):
            try:
                return shlex.split(line[len("ExecStart="):].replace("%%", "%").replace("$$", "$"))
            except ValueError:
                return line[len("ExecStart="):].split()
    return []
