"""Every serve option is defined once (ServeOptions); the resolved ServerConfig, the CLI and Server() follow it."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from conftest import run_pyllm
from pyllm_a100.serve.config import ServerConfig
from pyllm_a100.serve.resolve import resolve
from pyllm_a100.serve.options import ServeOptions

# ServerConfig's own fields that share a name with an option: the values resolve() resolves (a file, a free port,
# parsed endpoints and split, the draft's kind). Nothing else is repeated: the GPUs --gpus chose are read from the one
# list of devices, and the API key file is the request's (or the one its launch wrote).
RESOLVED = {"model", "port", "n_gpu_layers", "tensor_split", "rpc", "draft"}


def test_the_config_repeats_no_option_but_those_it_resolves() -> None:
    options = {f.name for f in dataclasses.fields(ServeOptions)}
    config = {f.name for f in dataclasses.fields(ServerConfig)}
    assert config & options == RESOLVED
    assert len(inspect.signature(resolve).parameters) <= 4


def test_the_resolved_config_cannot_be_changed_after_resolution(tiny_models: dict[str, Path], pyllm_home: Path) -> None:
    """Resolved once, frozen: no field of the config (nor of the request inside it, nor of a launch) can be set."""
    from pyllm_a100.serve import launch

    config = resolve(ServeOptions(str(tiny_models["tiny-llama"]), port=0, extra_args=["-c", "512"]))
    for f in dataclasses.fields(ServerConfig):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(config, f.name, getattr(config, f.name))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.options.port = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.options.extra_args.append("--no-mmap")  # type: ignore[attr-defined]
    prepared = launch.prepare(ServeOptions(str(tiny_models["tiny-llama"]), port=0, host="0.0.0.0", name="frozen"))
    assert prepared.key_file is not None and prepared.target.api_key_file is None, "the key file is the launch's"
    with pytest.raises(dataclasses.FrozenInstanceError):
        prepared.target.port = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        prepared.key_file = None  # type: ignore[misc]


def test_serve_options_and_the_server_config_agree_on_every_shared_default(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100.models.gguf_files import resolve_model

    files = resolve_model(tiny_models["tiny-llama"])
    asked = ServeOptions(str(files.first))
    config = ServerConfig(asked, files)
    for f in dataclasses.fields(ServeOptions):
        if hasattr(ServerConfig, f.name) and f.name not in ("model", "api_key_file"):
            value = getattr(config, f.name)
            expected = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            assert value == expected, f"{f.name}: ServerConfig says {value!r}, ServeOptions' default is {expected!r}"
    argv = config.to_argv("llama-server")
    assert argv[argv.index("--port") + 1] == str(asked.port) and argv[argv.index("--host") + 1] == asked.host
    assert argv[argv.index("--queue-timeout") + 1] == str(asked.queue_timeout) and ("--metrics" in argv) == asked.metrics


def test_the_serve_command_takes_its_defaults_from_the_options() -> None:
    """`pyllm serve --help` is generated from ServeOptions: each option's default is shown from there."""
    import typer.main

    from pyllm_a100.cli.app import app

    serve = typer.main.get_command(app).commands["serve"]
    defaults = {p.name: p.default for p in serve.params}
    for f in ServeOptions.cli_fields():
        if f.metadata.get("argument"):
            continue
        assert defaults[f.name] == f.default, f"--{f.name.replace('_', '-')}: the command says {defaults[f.name]!r}"


def test_a_detached_launch_runs_the_config_resolved_once(tiny_models: dict[str, Path], pyllm_home: Path) -> None:
    """request.json holds the request and its resolved config (model path, port, plan): the supervisor does not
    resolve it again."""
    result = run_pyllm("serve", str(tiny_models["tiny-llama"]), "--port", "0", "--detach", "--name", "once", timeout=300)
    try:
        assert result.returncode == 0, result.stderr
        launch = json.loads((pyllm_home / "servers" / "once" / "request.json").read_text())
        config = launch["resolved"]
        assert launch["kind"] == "server" and launch["port"] == 0 and config["port"] > 0
        assert config["model"] == str(tiny_models["tiny-llama"].resolve()) and config["capacity"]["slots"] >= 1
        (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)  # request.json's view + state.json
        assert entry["port"] == config["port"] and entry["plan"]["pool"] == config["capacity"]["pool"]
        state = json.loads((pyllm_home / "servers" / "once" / "state.json").read_text())
        assert state["port"] == config["port"] and "plan" not in state and "options" not in state, \
            "state.json records what changes (and where it listens), not the resolved config again"
    finally:
        run_pyllm("stop", "once")


@pytest.mark.parametrize("command", [["doctor", "tiny"], ["bench", "concurrency", "tiny", "--concurrency", "1"]])
def test_a_context_per_slot_has_its_own_name_and_the_old_spelling_says_so(command: list[str], tiny_models) -> None:
    model = str(tiny_models["tiny-llama"])
    argv = [model if a == "tiny" else a for a in command]
    bad = run_pyllm(*argv, "--ctx-per-slot", "0", "--prompt-tokens", "8", "--gen-tokens", "4") if "bench" in command \
        else run_pyllm(*argv, "--gpus", "1x8", "--ctx-per-slot", "0")
    assert bad.returncode != 0 and "--ctx-per-slot 0" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    old = run_pyllm(*argv, "--ctx-size", "-3", *(("--gpus", "1x8") if "doctor" in command else ("--prompt-tokens", "8")))
    assert "--ctx-size is now --ctx-per-slot" in old.stderr and "--ctx-per-slot -3" in old.stderr, old.stderr


def test_every_serve_and_rpc_worker_option_has_its_environment_variable(tiny_models: dict[str, Path]) -> None:
    """As llama.cpp's flags have LLAMA_ARG_*, every option of serve and rpc-worker can come from PYLLM_* (a container,
    a unit): the commands are generated from their options with those variables, and one is really read."""
    import typer.main

    from pyllm_a100.cli.app import app
    from pyllm_a100.rpc.worker import WorkerOptions

    commands = typer.main.get_command(app).commands
    for name, cls, prefix in (("serve", ServeOptions, "PYLLM_"), ("rpc-worker", WorkerOptions, "PYLLM_WORKER_")):
        given = {p.name: p.envvar for p in commands[name].params}
        for f in cls.cli_fields():
            assert given[f.name] == cls.envvar(f) and given[f.name].startswith(prefix), (name, f.name, given[f.name])
    assert len({cls.envvar(f) for f in ServeOptions.cli_fields()}) == len(ServeOptions.cli_fields())
    bad = run_pyllm("serve", str(tiny_models["tiny-llama"]), env={"PYLLM_CTX_SIZE": "-5"})
    assert bad.returncode == 78 and "--ctx-size -5" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
