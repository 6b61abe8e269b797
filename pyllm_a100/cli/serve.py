"""Managed servers and RPC workers: serve, rpc-worker, ps, stop, logs and the hidden _supervise."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..rpc.worker import WorkerOptions
from ..serve.options import ServeOptions
from .common import JsonListFlag, aligned, err
from .generated import command_from


def _progress_printer(label: str):
    """A rich progress bar fed with LoadProgress; returns (context manager, callback)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(), TimeElapsedColumn(), console=err, transient=True,
    )
    task = bar.add_task(label, total=None)

    def update(p) -> None:
        phase = {"loading": f"loading {label}", "preparing": "preparing (weights mapped; warming up)", "ready": "ready"}[p.phase]
        bar.update(task, completed=p.loaded, total=p.total, description=phase)

    return bar, update


def _print_ready(url: str, served_name: str, api_key: str | None, key_file: str | None, generated: bool, seconds: float | None) -> None:
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    print(f"ready{took}: {url}/v1  (model \"{served_name}\")")
    auth = ""
    if api_key and generated:
        print(f"API key (shown once; stored in {key_file}, mode 0600): {api_key}")
    if key_file:  # quoted for the shell: a name or PYLLM_HOME may hold spaces or quotes
        auth = f" -H \"Authorization: Bearer $(cat {shlex.quote(key_file)})\""
    body = json.dumps({"model": served_name, "messages": [{"role": "user", "content": "Hello"}]})
    print(f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d {shlex.quote(body)}")
    from ..llamacpp.native import build_info

    if build_info().get("ui"):
        print(f"  web UI: {url}/" + ("  (it asks for the API key)" if key_file else ""))
    sys.stdout.flush()


def _serve(ctx: typer.Context, **values) -> None:
    """Run llama-server on MODEL with a progress bar, safe defaults and supervision.

    Without --ctx-size the KV pool is planned from the memory free after the weights, and each of the
    slots may hold up to the model's trained context (pyllm doctor MODEL shows the plan).
    Every option can also be set by its environment variable (PYLLM_PORT, PYLLM_GPUS...).
    Extra llama-server flags go after --, e.g. pyllm serve m.gguf -- --no-mmap
    Configuration errors exit 78 (EX_CONFIG), other failures 1.
    """
    from ..errors import CONFIG_ERRORS, EX_CONFIG
    from ..serve import launch
    from ..serve.options import ServeOptions

    try:
        prepared = launch.prepare(ServeOptions(**values, extra_args=tuple(ctx.args)))
    except CONFIG_ERRORS as exc:
        exc.exit_code = EX_CONFIG  # main() prints the one line and exits with it: systemd's RestartPreventExitStatus
        raise
    _run_launch(prepared, _announce(prepared), values["detach"])


def _announce(prepared) -> str | None:
    """What serve prints before it starts: other servers on its GPUs, the devices, the model, plan and scheduling.
    Returns the API key to print with the ready line (given or generated), if any."""
    from ..devices.gpus import format_gpu_list
    from ..serve import launch

    cfg = prepared.target
    for other, shared in launch.overlapping(prepared):
        err.print(f"[yellow]warning:[/] GPU {format_gpu_list(shared)} also used by {other} (pyllm ps): the two servers share "
                  "its memory and compute; choose apart with --gpus, e.g. 0-3 and 4-7", highlight=False)
    if cfg.rpc:
        weights = list(cfg.tensor_split or [1.0] * len(cfg.devices))
        weights += [0.0] * (len(cfg.devices) - len(weights))
        for device, weight in zip(cfg.devices, weights):
            err.print(f"  {device.name:<6} {device.description:<36} {device.total_mib / 1024:7.1f} GiB "
                      f"({device.free_mib / 1024:.1f} free)  share {weight / (sum(weights) or 1.0):5.1%}")
    where = f", layers offloaded: {cfg.offload}" + (" (RPC workers)" if cfg.rpc else "") if cfg.n_gpu_layers else ", CPU"
    split = f", tensor split {cfg.options.tensor_split}" if cfg.options.tensor_split else ""
    if cfg.gpus is not None:
        split += f", GPUs {format_gpu_list(cfg.gpus)}"
    err.print(f"serving {cfg.model.first.name} ({cfg.model.architecture}, {len(cfg.model.shards)} file(s), "
              f"{cfg.model.total_bytes / 2**30:.2f} GiB{where}{split}) as {prepared.directory.name}", highlight=False)
    if cfg.draft is not None:
        d = cfg.draft.describe()
        per_step = f", at most {d['n_max']} tokens per step" if d["n_max"] else ""
        err.print(f"draft: {d['path']} ({d['spec_type']}{per_step})", highlight=False)
    if cfg.capacity is not None:
        err.print(f"plan: {cfg.capacity.summary()}", highlight=False)
    err.print(f"scheduling: {cfg.scheduling}", highlight=False)
    return cfg.options.api_key or prepared.generated_key


def _run_launch(prepared, key: str | None, detach: bool) -> None:
    """Start it, detached (return once ready) or in the foreground (until Ctrl-C), with the load's progress bar."""
    from ..serve import launch

    cfg = prepared.target
    key_file = str(prepared.key_file) if prepared.key_file else None
    bar, update = _progress_printer(cfg.model.name)

    def ready(seconds: float | None) -> None:
        bar.stop()
        _print_ready(cfg.public_url, cfg.served_name, key, key_file, prepared.generated_key is not None, seconds)

    if detach:
        with bar:
            proc = launch.start_detached(prepared)
            data = launch.wait_detached(prepared, proc, on_progress=update)
        ready((data.get("progress") or {}).get("seconds"))
        print(f"detached as {prepared.directory.name} (supervisor pid {proc.pid}); pyllm logs {prepared.directory.name} -f; pyllm stop {prepared.directory.name}")
        return
    started = time.monotonic()

    def foreground_ready(server) -> None:
        ready(time.monotonic() - started)
        print("Ctrl-C stops it.")

    with bar:
        code = launch.run(prepared, on_progress=update, on_ready=foreground_ready,
                          on_event=lambda m: err.print(m, highlight=False, soft_wrap=True, markup=False))
    sys.exit(code)


serve_cmd = command_from(ServeOptions, _serve, "serve", takes_context=True)


def _rpc_worker(**values) -> None:
    """Run llama.cpp's rpc-server from this build, supervised, so pyllm serve --rpc can put layers here.

    Every option can also be set by its environment variable (PYLLM_WORKER_PORT, PYLLM_WORKER_DEVICE...)."""
    from ..rpc.worker import NO_AUTH_WARNING, WorkerOptions
    from ..serve import launch

    prepared = launch.prepare_worker(WorkerOptions(**values))
    options = prepared.target
    if options.allow_network:
        err.print(f"[yellow]warning:[/] {NO_AUTH_WARNING}")
    if options.detach:
        proc = launch.start_detached(prepared)
        launch.wait_detached(prepared, proc)
        print(f"rpc-server ready at {options.host}:{options.port} as {prepared.directory.name} (supervisor pid {proc.pid})")
        print(f"use it: pyllm serve MODEL --rpc {options.endpoint}   stop it: pyllm stop {prepared.directory.name}")
        return

    def ready(worker) -> None:
        print(f"rpc-server ready at {options.host}:{options.port} (pid {worker.pid}); use it: pyllm serve MODEL --rpc {options.endpoint}")
        print("Ctrl-C stops it.")
        sys.stdout.flush()

    sys.exit(launch.run(prepared, on_ready=ready, on_event=lambda m: err.print(m, highlight=False, markup=False)))


rpc_worker_cmd = command_from(WorkerOptions, _rpc_worker, "rpc-worker")


def supervise_cmd(directory: Path) -> None:
    """(internal) Run the launch resolved in DIRECTORY/request.json (a server or an rpc-worker)."""
    from ..serve import launch

    sys.exit(launch.supervise(directory))


def ps_cmd(
    as_json: JsonListFlag = False,
    prune: Annotated[bool, typer.Option(help="Also remove failed servers' entries (their logs stay on disk).")] = False,
) -> None:
    """Managed servers: name, status, endpoint, model, PIDs. Stale entries are cleaned; failed ones stay until stopped or pruned."""
    from ..serve import state

    from ..serve.metrics import server_load

    entries, stale = state.list_servers(prune=prune)
    loads = {e.name: server_load(e) for e in entries}
    if as_json:
        print(json.dumps([dict(e.data, name=e.name, load=loads[e.name]) for e in entries], indent=2))
        return
    for name in stale:
        err.print(f"removed {'entry' if prune else 'stale entry'} {name} (its process is gone)", markup=False)
    if not entries:
        print("no managed servers")
        return
    from ..devices.gpus import format_gpu_list

    rows = []
    for e in entries:
        d = e.data
        pid = "-" if e.failed else (d.get("server_pid") or "-")
        used = d.get("gpus") if isinstance(d.get("gpus"), list) else []
        load = loads[e.name]
        busy = f"{load.get('processing', 0)}/{load.get('waiting', 0)}" if load else "-"
        rows.append([e.name, str(d.get("kind", "server")), str(d.get("status", "?")), str(d.get("url", "")), str(pid),
                     str(d.get("restarts", 0)), format_gpu_list(used) or "-", busy, str(d.get("model", ""))])
    # RUN/WAIT comes after the older columns, so that scripts reading GPUS by position keep working
    header, *lines = aligned(["NAME", "KIND", "STATUS", "URL", "PID", "RESTARTS", "GPUS", "RUN/WAIT", "MODEL"], rows,
                             right=frozenset({4, 5, 7}))
    print(header)
    for e, text in zip(entries, lines):
        d = e.data
        print(text)
        if d.get("service"):
            print(f"  service: {d['service']} (pyllm service status {e.name})")
        if isinstance(d.get("plan"), dict):
            print(f"  plan: {d['plan'].get('summary')}")
        for dev in d.get("devices") or []:
            where = f" {dev['description']}" if dev["name"].startswith("RPC") else ""
            held = (f": {dev['layers']} layers, {dev['weights_bytes'] / 2**30:.2f} GiB weights + "
                    f"{dev['kv_bytes'] / 2**30:.2f} GiB KV planned" if "layers" in dev else "")
            print(f"  {dev['name']}{where}{held} ({dev['free_mib'] / 1024:.1f} of {dev['total_mib'] / 1024:.1f} GiB free "
                  "at start)")
        if loads[e.name] and loads[e.name].get("kv_pool"):
            load = loads[e.name]
            print(f"  KV: {load.get('kv_reserved', 0):,} of {load['kv_pool']:,} tokens reserved, {load.get('waiting', 0)} request(s) waiting")
        if d.get("metrics"):
            key = "; send the API key" if d.get("api_key_file") else ""
            print(f"  metrics: {d['metrics']} (llama-server{key}) and pyllm metrics {e.name} (the supervisor)")
        if isinstance(d.get("draft"), dict):
            print(f"  draft: {d['draft'].get('path')} ({d['draft'].get('spec_type')})")
        if e.failed:
            print(f"  failed: {' '.join(str(d.get('error') or 'unknown').split())}")
            print(f"  logs: pyllm logs {e.name}; remove: pyllm stop {e.name} (or pyllm ps --prune)")


def stop_cmd(
    name: Annotated[Optional[str], typer.Argument(help="Server to stop (see pyllm ps).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every managed server.")] = False,
) -> None:
    """Stop a managed server (SIGTERM, then SIGKILL if it does not exit)."""
    from ..serve import state

    if all_:
        entries, stale = state.list_servers()
        for gone in stale:
            err.print(f"removed stale entry {gone} (its process is gone)", markup=False)
        if not entries:
            print("no managed servers")
    else:
        entries = [state.find(name)]
    for entry in entries:
        if state.stop(entry):
            print(f"stopped {entry.name}")
        else:
            print(f"removed {entry.name} ({'it had failed' if entry.failed else 'its process was gone'}; logs kept in {entry.directory})")


def logs_cmd(
    name: Annotated[Optional[str], typer.Argument(help="Server whose log to show (see pyllm ps).")] = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option("-n", help="Lines from the end to start with.")] = 50,
) -> None:
    """Print a managed server's llama-server log."""
    from ..serve import state

    entry = state.find(name)
    path = entry.log_path
    with open(path, "rb") as f:
        tail = f.read().decode("utf-8", errors="replace").splitlines()[-lines:]
        for line in tail:
            print(line)
        sys.stdout.flush()
        while follow:
            chunk = f.read()
            if chunk:
                sys.stdout.write(chunk.decode("utf-8", errors="replace"))
                sys.stdout.flush()
            elif not entry.alive():
                break
            else:
                time.sleep(0.3)


def metrics_cmd(
    name: Annotated[Optional[str], typer.Argument(help="One managed server (see pyllm ps); default: all of them.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        help="Write to this file instead (replaced atomically: node_exporter's textfile collector reads *.prom).")] = None,
) -> None:
    """The supervisors' figures in Prometheus text format: up, restarts, last restart reason, load seconds, ready since.

    llama-server's own counters (tokens, requests, KV cache) are at /metrics of a server started with --metrics.
    """
    from ..home import write_text_atomic
    from ..serve import state
    from ..serve.metrics import exposition

    entries = [state.find(name)] if name is not None else state.list_servers()[0]
    text = exposition(entries)
    if output is None:
        sys.stdout.write(text)
        return
    write_text_atomic(output, text)
