"""pyllm service install/uninstall/status/list: pyllm serve as a systemd unit (serve/systemd.py)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..serve.options import ServeOptions
from .common import err
from .generated import annotation

# serve's own --api-key (one definition); the unit keeps it in a 0600 EnvironmentFile as PYLLM_API_KEY
ServeApiKey = annotation(ServeOptions, "api_key")

service_app = typer.Typer(help="Run pyllm serve as a systemd service: started at boot, restarted on failure.",
                          no_args_is_help=True)

InstalledName = Annotated[str, typer.Argument(help="The service's name (pyllm service list).")]
UserFlag = Annotated[bool, typer.Option("--user", help="A user unit (~/.config/systemd/user; systemctl --user) instead of a system one.")]
RootOption = Annotated[Optional[Path], typer.Option(
    help="Write under this folder as if it were / (an image being built); systemctl is not run.")]


def _pyllm_executable() -> str:
    beside = Path(sys.executable).parent / "pyllm"
    found = str(beside) if beside.exists() else shutil.which("pyllm")
    if not found:
        from ..errors import ServiceError

        raise ServiceError("cannot find the pyllm executable (not beside this Python, not on PATH): install pyllm-a100 first")
    return os.path.abspath(found)


def _serve_options(model: str, args: list[str]) -> Any:
    """ServeOptions from serve's own command-line parser over MODEL and the options (its api_key is not used)."""
    import typer.main

    from ..serve.options import ServeOptions
    from .serve import serve_cmd

    alone = typer.Typer()  # serve as app.py registers it, on its own: its click command and parser
    alone.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(serve_cmd)
    ctx = typer.main.get_command(alone).make_context("pyllm service install NAME", [model, *args])
    return ServeOptions(**dict(ctx.params), extra_args=tuple(ctx.args))


def _serve_argv(options: Any, name: str, model: str) -> list[str]:
    """`pyllm serve MODEL --opt value ... --name NAME [-- extra]` with only the options that differ from serve's defaults."""
    import dataclasses

    from ..serve.llama_flags import absolute_paths

    if options.draft is not None and options.draft != "auto":
        options = dataclasses.replace(options, draft=os.path.abspath(os.path.expanduser(options.draft)))
    argv = [_pyllm_executable(), "serve", model, *options.cli_args(), "--name", name]
    if options.extra_args:
        argv += ["--", *absolute_paths(options.extra_args)]
    return argv


def install_cmd(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The service's name: unit pyllm-NAME.service, server NAME in pyllm ps.")],
    model: Annotated[str, typer.Argument(help="What pyllm serve takes: a .gguf file, shard 1 of a set, a folder; then serve's options.")],
    user: UserFlag = False,
    print_only: Annotated[bool, typer.Option("--print", help="Print the unit; install nothing.")] = False,
    root: RootOption = None,
    api_key: ServeApiKey = None,
    run_as: Annotated[Optional[str], typer.Option(
        help="A system unit runs as this user (User=), its PYLLM_HOME under that user's home unless PYLLM_HOME is set.")] = None,
) -> None:
    """Write a systemd unit running `pyllm serve MODEL SERVE-OPTIONS...` and start it (systemctl enable --now).

    Configuration errors make pyllm serve exit 78, which the unit does not restart (RestartPreventExitStatus=78).

    e.g. pyllm service install coder ./GLM-5-Q4 --host 0.0.0.0 --port 8080 --gpus 0-3 --metrics
    """
    import secrets

    from ..devices.gpus import parse_gpu_list
    from ..home import home
    from ..models.gguf_files import resolve_model
    from ..serve import systemd
    from ..process.net import is_loopback
    from ..serve.validate import check_api_key

    where = systemd.paths(name, user=user, root=root)
    options = _serve_options(model, list(ctx.args))
    resolved = str(resolve_model(model).first)  # absolute: systemd starts it with cwd /
    argv = _serve_argv(options, name, resolved)
    generated = None
    if api_key is not None:
        check_api_key(api_key)
    elif not is_loopback(options.host or "127.0.0.1"):
        api_key = generated = secrets.token_urlsafe(32)
    state_home = home().absolute()
    if run_as is not None:
        state_home = _home_of(run_as, user)
    environment = {"PYLLM_HOME": str(state_home), "CUDA_CACHE_MAXSIZE": "4294967296",
                   "PYLLM_SERVICE": systemd.unit_name(name)}
    if options.gpus:
        environment["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        environment["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, parse_gpu_list(options.gpus)))
    text = systemd.render(name, argv, environment, env_file=where.env_file if api_key else None, user=user,
                          description=f"pyllm serve {name} ({Path(resolved).name})", run_as=run_as)
    if print_only:
        sys.stdout.write(text)
        return
    if root is None and not systemd.systemd_running():
        sys.stdout.write(text)
        sys.stdout.flush()
        from ..errors import ServiceError

        raise ServiceError(f"systemd is not running on this machine ({systemd.SYSTEMD_RUNNING} is missing): nothing was "
                           "installed; the unit is printed above (install it where systemd runs), or use pyllm serve --detach")
    systemd.write(where, text, api_key)
    print(f"wrote {where.unit_on_disk}" + (f" and {where.env_file_on_disk} (mode 0600)" if api_key else ""))
    if generated:
        print(f"API key (shown once; stored in {where.env_file}, mode 0600): {generated}")
    if root is not None:
        print(f"not started (--root): enable it on that system with systemctl{' --user' if user else ''} enable {systemd.unit_name(name)}")
        return
    systemd.systemctl(user, "daemon-reload")
    systemd.systemctl(user, "enable", "--now", systemd.unit_name(name))
    scope = " --user" if user else ""
    print(f"started {systemd.unit_name(name)}: pyllm ps; journalctl{scope} -u {systemd.unit_name(name)} -f; pyllm service status {name}{scope}")


def _home_of(account: str, user: bool) -> Path:
    """PYLLM_HOME for a unit run as ``account``: $PYLLM_HOME when set, else that account's default."""
    import pwd

    from ..errors import InvalidArgument

    if user:
        raise InvalidArgument("--run-as is for system units: a --user unit runs as the user who installs it")
    try:
        entry = pwd.getpwnam(account)
    except KeyError:
        raise InvalidArgument(f"--run-as {account}: no such user on this machine (getent passwd {account})") from None
    raw = os.environ.get("PYLLM_HOME")
    return Path(raw).expanduser().absolute() if raw else Path(entry.pw_dir) / ".cache" / "pyllm-a100"


def uninstall_cmd(
    name: InstalledName,
    user: UserFlag = False,
    root: RootOption = None,
) -> None:
    """Stop and disable pyllm-NAME.service, then remove its unit and key file."""
    from ..serve import systemd

    where = systemd.paths(name, user=user, root=root)
    if not where.unit_on_disk.exists() and not where.env_file_on_disk.exists():
        raise systemd.not_installed(name, where, user)
    running = root is None and systemd.systemd_running()
    if running:
        systemd.systemctl(user, "disable", "--now", systemd.unit_name(name), check=False)
    for path in systemd.remove(where):
        print(f"removed {path}")
    if running:
        systemd.systemctl(user, "daemon-reload")
    elif root is None:
        err.print(f"systemd is not running here: nothing to stop or disable ({systemd.SYSTEMD_RUNNING} is missing)", markup=False)


def status_cmd(
    name: InstalledName,
    user: UserFlag = False,
    root: RootOption = None,
) -> None:
    """The unit (installed or not), systemd's view of it, and the server as pyllm ps sees it."""
    from ..serve import state, systemd

    where = systemd.paths(name, user=user, root=root)
    if not where.unit_on_disk.exists():
        raise systemd.not_installed(name, where, user)
    print(f"unit: {where.unit_on_disk}" + (f" (key in {where.env_file_on_disk})" if where.env_file_on_disk.exists() else ""))
    print("runs: " + " ".join(systemd.exec_start(where.unit_on_disk)))
    if root is None and systemd.systemd_running():
        shown = systemd.systemctl(user, "status", "--no-pager", "--lines=5", systemd.unit_name(name), check=False)
        print((shown.stdout or shown.stderr).rstrip())
    else:
        print(f"systemd: not running here ({systemd.SYSTEMD_RUNNING} is missing)")
    entries = {e.name: e for e in state.list_servers(clean=False)[0]}
    entry = entries.get(name)
    if entry is None:
        print(f"server: not listed by pyllm ps (PYLLM_HOME {state.servers_dir().parent})")
    else:
        d = entry.data
        print(f"server: {d.get('status')} at {d.get('url')}, restarts {d.get('restarts', 0)}"
              + (f", failed: {d.get('error')}" if entry.failed else ""))


def list_cmd(root: RootOption = None) -> None:
    """Installed pyllm services (system and user units), each with its model and pyllm ps status."""
    from ..serve import state, systemd

    rows = [(n, "system", p) for n, p in systemd.installed(False, root)] + [(n, "user", p) for n, p in systemd.installed(True, root)]
    if not rows:
        print("no pyllm services (pyllm service install NAME MODEL ...)")
        return
    entries = {e.name: e for e in state.list_servers(clean=False)[0]}
    print(f"{'NAME':<24} {'SCOPE':<7} {'SERVER':<10} MODEL")
    for name, scope, path in rows:
        words = systemd.exec_start(path)
        model = words[2] if len(words) > 2 and words[1] == "serve" else "?"
        status = entries[name].data.get("status", "?") if name in entries else "-"
        print(f"{name:<24} {scope:<7} {status:<10} {model}")


service_app.command("install", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(install_cmd)
service_app.command("uninstall")(uninstall_cmd)
service_app.command("status")(status_cmd)
service_app.command("list")(list_cmd)
