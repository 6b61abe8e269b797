"""pyllm bench and pyllm tune against real llama-server processes (figures are printed, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_pyllm


def test_bench_a_running_server_reports_every_figure(servers, tiny_deepseek4: Path) -> None:
    server = servers.start(tiny_deepseek4, parallel=2)
    result = run_pyllm("bench", "--url", server.base_url, "--prompt-tokens", "64", "--gen-tokens", "16",
                       "--concurrency", "2", "--repeat", "2", "--json")
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)
    assert row["requests"] == 4 and row["prompt_tokens"] == 64 and row["gen_tokens"] == 16
    assert row["prefill_tps"] > 0 and row["decode_tps"] > 0 and row["throughput_tps"] > 0 and 0 < row["ttft_s"] < row["wall_s"]
    log = server.log_text()
    assert log.count("prompt eval time =") >= 5 and "/    64 tokens" in log, "4 timed requests plus the warm-up, 64-token prompts"


def test_bench_serves_a_model_itself_and_prints_a_table(tiny_deepseek4: Path) -> None:
    result = run_pyllm("bench", str(tiny_deepseek4), "--prompt-tokens", "32", "--gen-tokens", "8", "--repeat", "1")
    assert result.returncode == 0, result.stderr
    header, values = result.stdout.strip().splitlines()
    assert "decode t/s" in header and values.split()[:4] == ["32", "8", "1", "1"]


def test_bench_bad_input_is_one_line(tiny_deepseek4: Path) -> None:
    both = run_pyllm("bench", str(tiny_deepseek4), "--url", "http://127.0.0.1:9")
    assert both.returncode == 1 and "not both" in both.stderr
    dead = run_pyllm("bench", "--url", "http://127.0.0.1:9")
    assert dead.returncode == 1 and dead.stderr.count("\n") == 1 and "does not answer" in dead.stderr


def test_tune_measures_candidates_and_prints_a_serve_command(tiny_deepseek4: Path) -> None:
    result = run_pyllm("tune", str(tiny_deepseek4), "--prompt-tokens", "32", "--gen-tokens", "8", "--repeat", "1", timeout=900)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    measured = [ln for ln in lines[1:] if not ln.startswith(("fastest", "  pyllm"))]
    assert [ln.split()[0] for ln in measured] == ["defaults", "-ub", "-ub", "-fa", "-fa"]  # no GPUs: no split candidates
    assert lines[-2].startswith("fastest: ")
    assert "x decode vs llama.cpp's defaults" in lines[-2] or "nothing beat them by more than 3%" in lines[-2]
    assert lines[-1].strip().startswith(f"pyllm serve {tiny_deepseek4}")


def test_tune_keeps_the_defaults_unless_beaten_by_more_than_noise() -> None:
    from pyllm_a100.bench import BenchResult, Candidate, TuneRow, winner

    def row(label: str, decode: float) -> TuneRow:
        result = BenchResult("http://x", 512, 64, 1, 2, prefill_tps=1000.0, decode_tps=decode, ttft_s=0.1, throughput_tps=decode, wall_s=1.0)
        return TuneRow(Candidate(label, [], []), result, None)

    defaults = row("defaults", 100.0)
    assert winner([defaults, row("-ub 256 -b 2048", 102.0), TuneRow(Candidate("-fa off", [], []), None, "failed")]) is defaults
    faster = row("1 GPU(s)", 110.0)
    assert winner([defaults, row("-fa on", 101.0), faster]) is faster
