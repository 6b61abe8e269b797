"""pyllm vendor: the pinned llama.cpp source."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..llamacpp import llama_source

vendor_app = typer.Typer(help="The pinned llama.cpp source (offline and intranet builds).", no_args_is_help=True)


@vendor_app.command("pack")
def vendor_pack(
    output: Annotated[Path, typer.Argument(help="Archive to write, e.g. llama.cpp-src.tar.gz")],
    source: Annotated[
        Optional[Path], typer.Option(help="Pack this llama.cpp tree or archive instead of the pinned one.")
    ] = None,
    with_ui: Annotated[
        bool, typer.Option("--with-ui", help="Also build llama-server's web UI with npm (needs npm and its registry "
                                             "here) and pack the assets: a build from the archive embeds them, no npm needed.")
    ] = False,
) -> None:
    """Write the trimmed llama.cpp source as one .tar.gz, for builds with no package index.

    Then, on the offline machine: pip install -r requirements.txt -C cmake.define.PYLLM_LLAMA_CPP_SOURCE=OUT.tar.gz .
    (-r requirements.txt: the bindings without a second llama.cpp build, as in the README.)
    """
    from ..llamacpp.native import build_info

    pin = llama_source.Pin(**build_info()["pin"])
    if source is None:
        with _temporary_dir(output) as work:
            sdist = llama_source.download_sdist(pin, work)
            written = llama_source.pack(sdist, output, marker=llama_source.pin_marker(pin), with_ui=with_ui, log=_say)
    else:
        if not source.exists():
            raise llama_source.SourceError(f"{source} does not exist: give a llama.cpp source tree or archive")
        written = llama_source.pack(source, output, marker=llama_source.describe(source, pin), with_ui=with_ui, log=_say)
    size = written.stat().st_size / 2**20
    ui = ", with the web UI built (tools/ui/dist)" if with_ui else ""
    print(f"wrote {written} ({size:.1f} MiB{ui})")
    print(f"build from it with: pip install -C cmake.define.PYLLM_LLAMA_CPP_SOURCE={written.resolve()} -r requirements.txt .")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _temporary_dir(near: Path):
    """A scratch folder beside ``near`` (same filesystem: the final rename stays atomic)."""
    import tempfile

    folder = near.resolve().parent
    folder.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix=".pyllm-", dir=folder)
