"""The `pyllm` command: thin commands over the library, one error-mapping main()."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from . import llama_source
from .errors import PyllmError

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
err = Console(stderr=True, highlight=False)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]


@app.command("build-info")
def build_info_cmd(as_json: JsonFlag = False) -> None:
    """What was built: llama.cpp commit and source, CUDA version and architectures, paths."""
    from .native import build_info

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
    preset: Annotated[str, typer.Argument(help="tiny-llama, tiny-deepseek4, tiny-glm-dsa, deepseek-v4-flash or glm-5.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Model file to write (NAME.gguf).")],
    layers: Annotated[Optional[int], typer.Option(help="Cut the depth to N layers (real-shape presets).")] = None,
    weight_type: Annotated[
        Optional[str], typer.Option("--type", help="f32, f16, bf16, q8_0, q4_0 or ud-q8-k-xl (MXFP4 experts, Q8_0 elsewhere).")
    ] = None,
    split_max_size: Annotated[
        Optional[str], typer.Option(help="Write a shard set NAME-0000k-of-0000N.gguf with shards up to this size (500M, 2G).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed gives the same bytes.")] = 0,
) -> None:
    """Write a synthetic GGUF model: a real architecture's layout and metadata, random weights."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from .synth import synthesize

    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=True, disable=not err.is_terminal,
    ) as bar:
        task = bar.add_task(f"synth {preset}", total=None)
        result = synthesize(
            preset, output, layers=layers, weight_type=weight_type, split_max_size=split_max_size, seed=seed,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    for path in result.paths:
        print(path)
    print(
        f"{result.preset} ({result.weight_type}, {result.layers} layers, {result.n_tensors} tensors): "
        f"{result.bytes_written / 2**20:.1f} MiB in {len(result.paths)} file(s), "
        f"{result.seconds:.2f} s, {result.mb_per_s:.0f} MB/s, peak RSS {result.peak_rss / 2**20:.0f} MiB"
    )


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
    from .native import build_info

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
    out.print(f"wrote {written} ({size:.1f} MiB)")
    out.print(f"build from it with: pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE={written.resolve()} -r requirements.txt .")


def _temporary_dir(near: Path):
    import tempfile

    near.parent.mkdir(parents=True, exist_ok=True) if near.parent != Path("") else None
    return tempfile.TemporaryDirectory(prefix=".pyllm-", dir=near.resolve().parent)


def main() -> None:
    """Entry point: known errors become one line on stderr and exit status 1."""
    try:
        app()
    except (PyllmError, llama_source.SourceError) as exc:
        if os.environ.get("PYLLM_DEBUG") == "1":
            raise
        err.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
