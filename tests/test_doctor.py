"""pyllm doctor on this machine (no GPU): build facts, model support, llama.cpp's own memory estimate."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_pyllm
from probe import unknown_arch_model


def test_doctor_reports_build_and_model_with_llama_cpps_estimate(tiny_models: dict[str, Path]) -> None:
    result = run_pyllm("doctor", str(tiny_models["tiny-deepseek4"]), "--ctx-per-slot", "2048", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["build"]["llama_cpp_commit"] == "0c1e57098" and report["build"]["cuda"] is False
    model = report["model"]
    assert model["architecture"] == "deepseek4" and model["supported"] and model["synthetic"] and model["layers"] == 4
    host = model["estimate_cpu_mib"]["Host"]
    assert set(host) == {"model", "context", "compute"} and host["compute"] > 0
    assert report["suggestion"] == f"pyllm serve {model['path']} --ctx-size 2048"
    texts = [f["text"] for f in report["findings"]]
    assert any("supported by this build" in t for t in texts) and any("no GPU visible" in t for t in texts)


def test_the_suggested_command_survives_a_path_with_spaces_and_quotes(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """The suggestion is a shell line: split as bash would, it names the file itself."""
    import shlex
    import shutil

    odd = tmp_path / "my models" / "it's v4 $x.gguf"
    odd.parent.mkdir()
    shutil.copyfile(tiny_models["tiny-deepseek4"], odd)  # a copy: doctor names a symlink by its target
    result = run_pyllm("doctor", str(odd), "--ctx-per-slot", "2048", "--json")
    assert result.returncode == 0, result.stderr
    words = shlex.split(json.loads(result.stdout)["suggestion"])
    assert words[:3] == ["pyllm", "serve", str(odd)] and words[3:] == ["--ctx-size", "2048"], words


def test_doctor_text_names_mxfp4_and_fails_on_an_unknown_architecture(tmp_path: Path) -> None:
    from pyllm_a100.synth import synthesize

    ud = synthesize("tiny-deepseek4", tmp_path / "ud.gguf", weight_type="ud-q8-k-xl").first
    text = run_pyllm("doctor", str(ud))
    assert text.returncode == 0 and "MXFP4" in text.stdout and "dequantizes" in text.stdout
    unknown = run_pyllm("doctor", str(unknown_arch_model(tmp_path / "future.gguf")))
    assert unknown.returncode == 1 and "architecture future-arch-9: unknown to this build" in unknown.stdout


def test_model_load_logs_no_decoding_errors(tiny_models: dict[str, Path]) -> None:
    """llama.cpp cuts metadata previews mid-character; the log callback must not raise on them."""
    from conftest import run_python

    code = f"from pyllm_a100 import Llama\nLlama({str(tiny_models['tiny-deepseek4'])!r}, n_ctx=128, verbose=True).close()\n"
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "llama_model_loader" in result.stderr, "verbose=True shows llama.cpp's log"
    assert "UnicodeDecodeError" not in result.stderr and "Exception ignored" not in result.stderr
    quiet = run_python(code.replace("verbose=True", "verbose=False"))
    assert quiet.returncode == 0 and "llama_model_loader" not in quiet.stderr, quiet.stderr[-500:]


def test_capacity_finding_is_the_plan_serve_makes_on_these_gpus(tiny_models) -> None:
    """The GPU branch's slot advice (no GPU here, so two cards are given as NVML would list them): the same plan
    pyllm serve prints, 16 slots each up to the trained context; GPUs already busy with other processes get less."""
    from pyllm_a100.doctor import _capacity_finding
    from pyllm_a100.devices.gpus import GPU
    from pyllm_a100.models.gguf_files import resolve_model

    gib = 2**30
    files = resolve_model(tiny_models["tiny-glm-dsa"])
    gpus = [GPU(i, i, "NVIDIA A100-SXM4-80GB", f"GPU-{i}", "8.0", 80 * gib, 79 * gib, False) for i in range(2)]
    report: dict = {}
    finding = _capacity_finding(report, files, gpus)
    assert finding.level == "ok" and "16 slots, up to 4,096 tokens each (the trained context)" in finding.text
    assert report["plan"]["slots"] == 16 and report["plan"]["pool"] == 16 * 4096 and report["plan"]["fits"]
    full = [GPU(i, i, "NVIDIA A100-SXM4-80GB", f"GPU-{i}", "8.0", 80 * gib, 0, False) for i in range(2)]
    report = {}
    assert _capacity_finding(report, files, full).level == "warn" and not report["plan"]["fits"]


def test_the_tensor_split_line_says_which_families_the_pin_allows(tiny_models: dict[str, Path]) -> None:
    """Read from the build's own list (llm_arch_supports_sm_tensor): the pin splits deepseek4 and llama by tensor,
    not glm-dsa nor deepseek32; DeepSeek-V4's line cites upstream's open segfault."""
    from pyllm_a100.llamacpp.native import build_info

    refused = build_info()["sm_tensor_unsupported"]
    lines = {}
    for preset in ("tiny-deepseek4", "tiny-glm-dsa"):
        report = json.loads(run_pyllm("doctor", str(tiny_models[preset]), "--json", check=True).stdout)
        (lines[preset],) = [f["text"] for f in report["findings"] if f["text"].startswith("--split-mode tensor")]
    served = [a for a in ("deepseek4", "glm-dsa", "deepseek32", "llama") if a not in refused]
    assert served == ["deepseek4", "llama"], refused
    for line in lines.values():
        assert "this llama.cpp allows it for deepseek4, llama of the served families" in line, line
    assert "available for deepseek4" in lines["tiny-deepseek4"] and "#28826" in lines["tiny-deepseek4"]
    assert "not implemented for glm-dsa" in lines["tiny-glm-dsa"]
