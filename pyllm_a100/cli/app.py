"""The `pyllm` command: thin commands over the library, one error-mapping main()."""

from __future__ import annotations

import os
import sys

import typer

from ..llamacpp import llama_source
from ..errors import PyllmError
from . import bench, doctor, generate, models, serve
from .common import err
from .systemd import service_app
from .vendor import vendor_app


def _flags_take_no_value() -> None:
    """No ``<bool>`` beside a flag in --help (``--json <bool>`` reads as if ``--json true`` were accepted; it is an error).

    typer 0.29's rich help prints every option's type (TyperOption.display_type_rich: ``<int>``, ``<str>``...)
    and does not leave out flags, --help included; older typer and click print nothing for a flag. Not our
    metavar (none is set) nor rich_markup_mode: the type column itself. A flag gets no type here.
    """
    option = getattr(typer.core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "_pyllm_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    display_type_rich._pyllm_flags = True
    option.display_type_rich = display_type_rich


_flags_take_no_value()

app = typer.Typer(
    name="pyllm",
    help="Run DeepSeek-V4-Flash, GLM-5.x and friends on A100/A800 through llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(vendor_app, name="vendor")

# Registered here, in this order: the order of `pyllm --help`.
app.command("build-info")(doctor.build_info_cmd)
app.command("synth")(models.synth_cmd)
app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(serve.serve_cmd)
app.command("generate")(generate.generate_cmd)
app.command("demo")(generate.demo_cmd)
app.command("doctor")(doctor.doctor_cmd)
app.command("fetch")(models.fetch_cmd)
app.command("models")(models.models_cmd)
app.command("rpc-worker")(serve.rpc_worker_cmd)
app.add_typer(bench.bench_app, name="bench")
app.command("tune")(bench.tune_cmd)
app.command("_supervise", hidden=True)(serve.supervise_cmd)
app.command("ps")(serve.ps_cmd)
app.command("stop")(serve.stop_cmd)
app.command("logs")(serve.logs_cmd)
app.command("metrics")(serve.metrics_cmd)
app.add_typer(service_app, name="service")


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
        args = sys.argv[1:]
        if args[:1] == ["bench"]:  # `pyllm bench MODEL --verify-cost ...` of earlier releases -> its subcommand
            args = ["bench", *bench.legacy_argv(args[1:])]
        code = app(args=args, standalone_mode=False)
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
        sys.exit(getattr(exc, "exit_code", 1))  # 1, or what the command set (serve: EX_CONFIG for config errors)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
