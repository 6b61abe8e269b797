"""Co-tenancy (issue 55, patch 0044): a stream keeps decoding while another request's long prompt is prefilled,
and a short request does not wait for that whole prefill. Each test runs pyllm serve's defaults and llama.cpp's own
scheduling side by side in one run (`pyllm bench cotenancy`'s library), on real llama-server processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import run_pyllm
from pyllm_a100.bench import cotenancy
from pyllm_a100.errors import EX_CONFIG
from pyllm_a100.serve.options import DEFAULT_DECODE_LATENCY_TARGET as TARGET_MS

# A step that carries prompt tokens is planned at up to 3 targets (patch 0044's STEP_LIMIT; the decode-only steps
# after it bring the average back to the target). The cost model learns a prompt token's cost as the prompt deepens,
# so a late chunk overshoots its plan: on a quiet 2-core machine the worst gap was 349-396 ms (4 runs), 408 ms in a
# CI run. The worst gap is held against the baseline's, measured side by side in the same run (a slow or busy
# machine slows both), not against a fixed number of milliseconds.
K = 4


def test_a_stream_keeps_its_pace_beside_a_long_prompt_with_the_same_tokens(tiny_deepseek4: Path) -> None:
    ours, base = rows = cotenancy.compare(tiny_deepseek4, cotenancy.Load(prompts=1, prompt_tokens=3500, short_tokens=200))
    assert base.gap_max_ms > TARGET_MS * K, f"the baseline must stall the stream for the test to mean anything: {base}"
    assert ours.gap_max_ms * 2 < base.gap_max_ms, f"worst gap {ours.gap_max_ms:.0f} ms, baseline's {base.gap_max_ms:.0f}: {ours}"
    # more of the stream's tokens inside the prefill; not a ratio: on this tiny model (1,000 tokens/s alone) the
    # window's edges, tens of ms of client-side timing, hold as many tokens as the baseline's whole stall
    assert ours.during_tps > base.during_tps, (ours, base)
    # the short request waits for the step under way (on the CPU a full batch: 1.06-1.16 s here), not for the rest of
    # the prefill as the baseline's does (2.6 s)
    assert ours.short_ttft_s is not None and ours.short_ttft_s < ours.prefill_s / 2, (ours, base)
    assert ours.short_ttft_s < base.short_ttft_s / 1.5, (ours, base)
    assert ours.prefill_s < 2 * base.prefill_s, "the long prompt completes, at a bounded cost"
    assert cotenancy.same_tokens(rows), "the scheduling changes which tokens share a step, not the stream's tokens"


def test_bench_cotenancy_on_smollm2_the_short_request_does_not_wait(smollm2: Path) -> None:
    """The real model through the command, --json: the short request's first token comes long before the 3,000-token
    prefill beside it ends (llama.cpp's slot order made it wait for all of it)."""
    result = run_pyllm("bench", "cotenancy", str(smollm2), "--prompt-tokens", "3000", "--json", timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ours, base = report["rows"]
    fields = {"solo_tps", "during_tps", "gap_p50_ms", "gap_p99_ms", "gap_max_ms", "prefill_s", "short_ttft_s"}
    assert fields <= set(ours) and ours["server"] == "pyllm serve" and base["server"].startswith("llama.cpp's scheduling")
    assert ours["short_ttft_s"] < ours["prefill_s"] / 3 and base["short_ttft_s"] > base["prefill_s"] / 2, report
    assert ours["during_tps"] > base["during_tps"] and ours["gap_max_ms"] < base["gap_max_ms"], report


@pytest.mark.parametrize("flag,value,says", [
    ("--decode-latency-target", "-1", "--decode-latency-target -1: give milliseconds from 0"),
    ("--decode-latency-target", "60001", "--decode-latency-target 60001: give milliseconds from 0"),
    ("--prefill-min-chunk", "0", "--prefill-min-chunk 0: give a number of tokens from 1"),
    ("--batch-size", "0", "--batch-size 0: give the prompt tokens a step may take"),
])
def test_bad_scheduling_values_are_one_line_errors(flag: str, value: str, says: str, tiny_deepseek4: Path) -> None:
    result = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", flag, value)
    assert result.returncode == EX_CONFIG and says in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize("value", ["50x", "", "1.5", "-1", "60001"])
def test_llama_server_refuses_a_bad_target_in_one_line(value: str) -> None:
    from pyllm_a100.llamacpp.native import binary

    result = subprocess.run([str(binary("llama-server")), "--decode-latency-target", value], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0
    assert f"invalid value '{value}': --decode-latency-target takes whole milliseconds from 0 (off) to 60000" in result.stderr


def test_serve_and_doctor_say_the_scheduling(tiny_deepseek4: Path, pyllm_home: Path) -> None:
    started = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--detach", "--name", "sched", timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        assert f"scheduling: decoding streams keep a token every {TARGET_MS} ms on average" in started.stderr
        (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
        argv = (pyllm_home / "servers" / "sched" / "server.log").read_text().split("starting llama-server: ")[1].split()
        assert argv[argv.index("--decode-latency-target") + 1] == str(TARGET_MS) and argv[argv.index("--batch-size") + 1] == "512"
        assert entry["options"]["decode_latency_target"] == TARGET_MS
        # on the CPU every prompt step is a full batch (small chunks deep in a prompt cost a CPU 1.67x; 512: 1.25x)
        assert argv[argv.index("--prefill-min-chunk") + 1] == "512" and "--prefill-lane" not in argv
    finally:
        run_pyllm("stop", "sched")
    off = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--detach", "--name", "off", "--decode-latency-target", "0",
                    timeout=300)
    try:
        assert "no decode latency target (a long prompt stalls decoding streams)" in off.stderr, off.stderr
    finally:
        run_pyllm("stop", "off")
    doctor = json.loads(run_pyllm("doctor", str(tiny_deepseek4), "--json", check=True).stdout)
    assert any(f["text"].startswith(f"scheduling: pyllm serve keeps decoding streams at a token about every {TARGET_MS} ms")
               for f in doctor["findings"])


def test_scheduling_flags_after_dashes_are_the_users_and_passed_once(tiny_deepseek4: Path) -> None:
    """`pyllm serve m.gguf -- --decode-latency-target 5 -b 64`: llama-server gets the user's values, once each, and
    serve says the scheduling is theirs (it printed its own 100 ms before, and passed both)."""
    from pyllm_a100.serve.resolve import resolve
    from pyllm_a100.serve.options import ServeOptions

    cfg = resolve(ServeOptions(model=str(tiny_deepseek4), port=0,
                                   extra_args=["--decode-latency-target", "5", "-b", "64"]), require_api_key=False)
    argv = cfg.to_argv("llama-server")
    assert argv.count("--decode-latency-target") == 1 and argv[argv.index("--decode-latency-target") + 1] == "5"
    assert "--batch-size" not in argv and argv[argv.index("-b") + 1] == "64"
    assert argv[argv.index("--prefill-min-chunk") + 1] == "64", "what the user left out keeps pyllm's default: on the CPU the batch"
    assert "--decode-latency-target 5, -b 64" in cfg.scheduling, cfg.scheduling


def test_the_defaults_follow_the_devices_the_layers_are_on(tiny_deepseek4: Path, tmp_path: Path) -> None:
    """GPUs (fake A100s: what NVML reports): the prefill lane for prompts of 2,048+ tokens and a 64-token floor; the
    CPU (this machine): no lane and every prompt step a full batch (small chunks deep in a prompt cost a CPU 1.67x)."""
    from fake_gpus import fake_gpu_env

    from conftest import run_python

    code = f"""
from pyllm_a100.serve.resolve import resolve
from pyllm_a100.serve.options import ServeOptions
argv = resolve(ServeOptions(model={str(tiny_deepseek4)!r}, port=0), require_api_key=False).to_argv("llama-server")
value = lambda flag: argv[argv.index(flag) + 1] if flag in argv else None
print(value("--prefill-lane"), value("--prefill-min-chunk"), value("--batch-size"))
"""
    on_gpus = run_python(code, env=fake_gpu_env(tmp_path / "fake", 1))
    on_cpu = run_python(code)
    assert on_gpus.returncode == 0 and on_cpu.returncode == 0, (on_gpus.stderr, on_cpu.stderr)
    assert on_gpus.stdout.split() == ["2048", "64", "512"], on_gpus.stdout
    assert on_cpu.stdout.split() == ["None", "512", "512"], on_cpu.stdout
