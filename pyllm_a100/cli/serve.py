"""Managed servers and RPC workers: serve, rpc-worker, ps, stop, logs and the hidden _supervise."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import MODEL_HELP, JsonListFlag, aligned, err


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
    Extra llama-server flags go after --, e.g. pyllm serve m.gguf -- --no-mmap
    Configuration errors exit 78 (EX_CONFIG), other failures 1.
    """
    from ..errors import CONFIG_ERRORS, EX_CONFIG
    from ..serve.options import ServeOptions

    try:
        _serve_options(ServeOptions(**values, extra_args=list(ctx.args)))
    except CONFIG_ERRORS as exc:
        exc.exit_code = EX_CONFIG  # main() prints the one line and exits with it: systemd's RestartPreventExitStatus
        raise


def _command_from_options(run):
    """A typer command whose parameters are ServeOptions' fields: their types, help, environment and defaults."""
    import dataclasses
    import inspect
    import typing

    from ..serve.options import ServeOptions

    hints = typing.get_type_hints(ServeOptions)
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    for f in ServeOptions.cli_fields():
        kind = hints[f.name]
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(inner) == 1 and type(None) in typing.get_args(kind):
            kind = Optional[inner[0]]
        info = (typer.Argument(help=f.metadata["help"]) if f.metadata.get("argument")
                else typer.Option(help=f.metadata["help"], envvar=f.metadata.get("envvar")))
        default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        params.append(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                        annotation=Annotated[kind, info]))

    def command(ctx: typer.Context, **values) -> None:
        run(ctx, **values)

    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = run.__doc__
    command.__name__ = "serve"
    return command


serve_cmd = _command_from_options(_serve)


def _serve_options(options) -> None:
    from ..serve import launch

    prepared = launch.prepare(options)
    _warn_overlaps(prepared)
    cfg = prepared.config
    if cfg.rpc:
        _print_devices(cfg.devices, cfg.tensor_split)
    key = options.api_key or prepared.generated_key
    key_file = str(cfg.api_key_file) if cfg.api_key_file else None
    where = f", layers offloaded: {cfg.offload}" + (" (RPC workers)" if cfg.rpc else "") if cfg.n_gpu_layers else ", CPU"
    split = f", tensor split {options.tensor_split}" if options.tensor_split else ""
    if cfg.gpus is not None:
        from ..devices.gpus import format_gpu_list

        split += f", GPUs {format_gpu_list(cfg.gpus)}"
    err.print(
        f"serving {cfg.model.first.name} ({cfg.model.architecture}, {len(cfg.model.shards)} file(s), "
        f"{cfg.model.total_bytes / 2**30:.2f} GiB{where}{split}) as {prepared.directory.name}", highlight=False
    )
    if cfg.draft is not None:
        d = cfg.draft.describe()
        per_step = f", at most {d['n_max']} tokens per step" if d["n_max"] else ""
        err.print(f"draft: {d['path']} ({d['spec_type']}{per_step})", highlight=False)
    if cfg.capacity is not None:
        err.print(f"plan: {cfg.capacity.summary()}", highlight=False)
    err.print(f"scheduling: {cfg.scheduling}", highlight=False)
    bar, update = _progress_printer(cfg.model.name)
    if options.detach:
        proc = launch.start_detached(prepared)
        with bar:
            data = launch.wait_detached(prepared, proc, on_progress=update)
        _print_ready(cfg.public_url, cfg.served_name, key, key_file,
                     prepared.generated_key is not None, (data.get("progress") or {}).get("seconds"))
        print(f"detached as {prepared.directory.name} (supervisor pid {proc.pid}); pyllm logs {prepared.directory.name} -f; pyllm stop {prepared.directory.name}")
        return

    def ready(server) -> None:
        bar.stop()
        _print_ready(cfg.public_url, cfg.served_name, key, key_file,
                     prepared.generated_key is not None, time.monotonic() - started)
        print("Ctrl-C stops it.")

    started = time.monotonic()
    with bar:
        code = launch.run(prepared, on_progress=update, on_ready=ready,
                          on_event=lambda m: err.print(m, highlight=False, soft_wrap=True, markup=False))
    sys.exit(code)


def _warn_overlaps(prepared) -> None:
    from ..devices.gpus import format_gpu_list
    from ..serve import launch

    for other, shared in launch.overlapping(prepared):
        err.print(f"[yellow]warning:[/] GPU {format_gpu_list(shared)} also used by {other} (pyllm ps): the two servers share "
                  "its memory and compute; choose apart with --gpus, e.g. 0-3 and 4-7", highlight=False)


def _print_devices(devices, split) -> None:
    """The devices llama.cpp will use (local GPUs and RPC workers), their memory, and each one's share."""
    weights = split or [1.0] * len(devices)
    weights = list(weights) + [0.0] * (len(devices) - len(weights))
    total = sum(weights) or 1.0
    for device, weight in zip(devices, weights):
        err.print(f"  {device.name:<6} {device.description:<36} {device.total_mib / 1024:7.1f} GiB ({device.free_mib / 1024:.1f} free)  share {weight / total:5.1%}")


def rpc_worker_cmd(
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless --allow-network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 50052,
    device: Annotated[Optional[str], typer.Option(help="Devices to offer, e.g. CUDA0,CUDA1 (default: all).")] = None,
    cache: Annotated[bool, typer.Option(help="Cache received tensors on local disk (faster reloads).")] = False,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads for a CPU device.")] = None,
    allow_network: Annotated[bool, typer.Option(
        help="Bind a non-loopback address. rpc-server has NO authentication and has had memory-safety bugs "
             "reachable over the network: use only on a private network or behind a tunnel.")] = False,
    name: Annotated[Optional[str], typer.Option(help="Name in pyllm ps/stop/logs: letters, digits, . _ - (default: rpc-worker-PORT).")] = None,
    detach: Annotated[bool, typer.Option(help="Return once it answers; a supervisor keeps it running.")] = False,
    restart: Annotated[Optional[int], typer.Option(help="Restarts after a crash (default: 3 detached, 0 in the foreground).")] = None,
) -> None:
    """Run llama.cpp's rpc-server from this build, supervised, so pyllm serve --rpc can put layers here."""
    from ..serve import launch
    from ..serve.rpc import NO_AUTH_WARNING

    request = launch.WorkerRequest(host=host, port=port, devices=device, cache=cache, threads=threads,
                                    allow_network=allow_network, name=name,
                                    restart=restart if restart is not None else (3 if detach else 0))
    prepared = launch.prepare_worker(request)
    if allow_network:
        err.print(f"[yellow]warning:[/] {NO_AUTH_WARNING}")
    endpoint = prepared.config.endpoint
    if detach:
        proc = launch.start_detached(prepared)
        launch.wait_detached(prepared, proc)
        print(f"rpc-server ready at {prepared.config.host}:{port} as {prepared.directory.name} (supervisor pid {proc.pid})")
        print(f"use it: pyllm serve MODEL --rpc {endpoint}   stop it: pyllm stop {prepared.directory.name}")
        return

    def ready(worker) -> None:
        print(f"rpc-server ready at {prepared.config.host}:{port} (pid {worker.pid}); use it: pyllm serve MODEL --rpc {endpoint}")
        print("Ctrl-C stops it.")
        sys.stdout.flush()

    sys.exit(launch.run(prepared, on_ready=ready, on_event=lambda m: err.print(m, highlight=False, markup=False)))


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
