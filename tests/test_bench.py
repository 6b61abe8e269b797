"""pyllm bench and pyllm tune against real llama-server processes (figures are printed, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
    from pyllm_a100.bench.run import BenchResult
    from pyllm_a100.bench.tune import Candidate, TuneRow, winner

    def row(label: str, decode: float) -> TuneRow:
        result = BenchResult("http://x", 512, 64, 1, 2, prefill_tps=1000.0, decode_tps=decode, ttft_s=0.1, throughput_tps=decode, wall_s=1.0)
        return TuneRow(Candidate(label, [], []), result, None)

    defaults = row("defaults", 100.0)
    assert winner([defaults, row("-ub 256 -b 2048", 102.0), TuneRow(Candidate("-fa off", [], []), None, "failed")]) is defaults
    faster = row("1 GPU(s)", 110.0)
    assert winner([defaults, row("-fa on", 101.0), faster]) is faster


# --- issue 17: concurrency levels, verify cost, draft runs ----------------------------------------


def test_concurrency_levels_on_a_running_server(servers, tiny_deepseek4: Path) -> None:
    server = servers.start(tiny_deepseek4, parallel=4, ctx_size=4 * 256)
    result = run_pyllm("bench", "--url", server.base_url, "--concurrency", "1,2,4", "--prompt-tokens", "32", "--gen-tokens", "8",
                       "--repeat", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    levels = report["levels"]
    assert [r["concurrency"] for r in levels] == [1, 2, 4] and report["failures"] == 0
    for r in levels:
        assert r["requests"] == 2 * r["concurrency"] and r["failures"] == 0 and r["generated_tokens"] == 8 * r["requests"]
        assert r["aggregate_tps"] > 0 and r["per_stream_tps"] > 0 and 0 < r["ttft_p50_s"] <= r["ttft_p99_s"] < r["wall_s"]
    assert levels[0]["scaling"] == 1.0
    warm_ups = 1 + 4  # one request alone, then one per stream of the highest level
    assert server.log_text().count("prompt eval time =") == warm_ups + 2 * (1 + 2 + 4), "the warm-ups plus every counted request"
    text = run_pyllm("bench", "--url", server.base_url, "--concurrency", "1,2", "--prompt-tokens", "16", "--gen-tokens", "4",
                     "--repeat", "1")
    assert text.returncode == 0, text.stderr
    assert "aggregate t/s" in text.stdout and "TTFT p99 s" in text.stdout
    rows = [ln.split() for ln in text.stdout.splitlines() if ln.split()[:1] == ["-"]]
    assert [r[1] for r in rows] == ["1", "2"] and rows[0][3] == "1.00"


def test_bench_starts_one_server_per_parallel_value(tiny_deepseek4: Path) -> None:
    result = run_pyllm("bench", str(tiny_deepseek4), "--concurrency", "1,2", "--parallel", "default,2,2u", "--prompt-tokens", "32",
                       "--gen-tokens", "8", "--repeat", "1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [(r["slots"], r["concurrency"]) for r in report["levels"]] == [
        ("default", 1), ("default", 2), ("2", 1), ("2", 2), ("2u", 1), ("2u", 2)]
    assert all(r["failures"] == 0 and r["aggregate_tps"] > 0 for r in report["levels"])
    argv = report["servers"]
    from pyllm_a100.serve.options import DEFAULT_PARALLEL

    default = argv["default"]  # pyllm serve's plan: DeepSeek-V4's caches are per sequence, so no --kv-unified
    assert default[default.index("--parallel") + 1] == str(DEFAULT_PARALLEL) and "--kv-unified" not in default
    two, unified = argv["2"], argv["2u"]
    assert two[two.index("--parallel") + 1] == "2" and "--kv-unified" not in two
    assert unified[unified.index("--parallel") + 1] == "2" and "--kv-unified" in unified
    per_slot = int(default[default.index("--ctx-size") + 1]) // DEFAULT_PARALLEL  # the last --ctx-size wins: the plan's
    assert default.count("--ctx-size") == 1
    assert per_slot >= 40 and int(two[two.index("--ctx-size") + 1]) == 2 * per_slot, "every slot gets the same context"


def test_agents_compares_serve_defaults_with_a_baseline_and_reuses_the_shared_prefix(tiny_models: dict[str, Path]) -> None:
    """pyllm bench agents MODEL: serve's defaults, then a baseline, same load; the shared system prompt comes
    from the prompt cache after its first use; every request of serve's side completes."""
    from pyllm_a100.bench.agents import AgentLevel, ratios

    result = run_pyllm("bench", "agents", str(tiny_models["tiny-llama"]), "--concurrency", "2,4", "--system-tokens", "256",
                       "--tail-tokens", "32", "--gen-tokens", "8", "--repeat", "2",
                       "--baseline-args=--parallel 2 --ctx-size 2048", "--json", timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["load"] == {"system_tokens": 256, "tail_tokens": 32, "gen_tokens": 8, "requests_per_client": 2}
    rows = [AgentLevel(**r) for r in report["levels"]]
    assert [(r.server, r.clients) for r in rows] == [("pyllm serve", 2), ("pyllm serve", 4),
                                                     ("llama.cpp --parallel 2 --ctx-size 2048", 2),
                                                     ("llama.cpp --parallel 2 --ctx-size 2048", 4)]
    ours = rows[:2]
    assert all(r.failures == 0 and r.requests == 2 * r.clients and r.aggregate_tps > 0 for r in ours), ours
    assert all(0.3 < r.prompt_reused < 1 for r in ours), [r.prompt_reused for r in ours]  # 256 of 288 tokens shared
    lines = ratios(rows)
    assert len(lines) == 2 and lines[0].startswith("2 clients, pyllm serve / llama.cpp --parallel 2 --ctx-size 2048: tokens/s ")


def test_verify_cost_gives_one_row_per_k(tiny_deepseek4: Path) -> None:
    result = run_pyllm("bench", str(tiny_deepseek4), "--verify-cost", "1-4", "--depth", "64", "--json")
    assert result.returncode == 0, result.stderr
    cost = json.loads(result.stdout)
    assert [r["k"] for r in cost["rows"]] == [1, 2, 3, 4] and cost["depth"] == 64 and cost["decode_ms"] > 0
    assert all(r["ms"] > 0 and abs(r["ratio"] - r["ms"] / cost["decode_ms"]) < 1e-9 for r in cost["rows"])
    # the weights each forward must read against one token's (tiny-deepseek4: 2 of 8 experts a token)
    weights = [r["weights"] for r in cost["rows"]]
    assert weights[0] == pytest.approx(1.0) and weights == sorted(weights) and weights[3] > 1.0
    assert cost["argv"][cost["argv"].index("-d") + 1] == "64" and cost["argv"][cost["argv"].index("-p") + 1] == "1,2,3,4"
    text = run_pyllm("bench", str(tiny_deepseek4), "--verify-cost", "2,8", "--depth", "32")
    assert text.returncode == 0, text.stderr
    assert [ln.split()[0] for ln in text.stdout.splitlines() if ln.split()[:1] in (["2"], ["8"])] == ["2", "8"]
    assert "x weights read" in text.stdout


def test_spec_args_read_the_draft_counts(tiny_models: dict[str, Path]) -> None:
    """tiny-llama drafting for itself (draft-simple): llama-server's draft_n / draft_n_accepted reach the report."""
    model = tiny_models["tiny-llama"]
    result = run_pyllm("bench", str(model), "--spec-args", f"-md {model} --spec-type draft-simple --spec-draft-n-max 4",
                       "--prompt-tokens", "16", "--gen-tokens", "32", "--repeat", "2", "--json")
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)
    assert run["drafted"] > 0 and run["accepted"] > 0 and run["acceptance"] >= 0.9, run
    assert run["same_tokens"] and run["first_difference"] == [None] * run["requests"], "temperature 0: the draft must not change the tokens"
    assert run["steps"] == 2 * (32 - 1) - run["accepted"]
    assert run["plain_step_ms"] > 0 and run["draft_step_ms"] > 0


@pytest.mark.parametrize("args, says", [
    (["--concurrency", "0"], "--concurrency '0'"),
    (["--concurrency", "1,,4"], "--concurrency '1,,4'"),
    (["--concurrency", "x"], "'x' is not a whole number"),
    (["--concurrency", "2,2"], "given twice"),
    (["--parallel", "default,default", "--concurrency", "1,2"], "given twice"),
    (["--parallel", "0u", "--concurrency", "1,2"], "out of range"),
    (["--verify-cost", "5-2"], "--verify-cost 5-2"),
    (["--verify-cost", "0-4"], "--verify-cost 0-4"),
    (["--verify-cost", "1-4", "--spec-args", "-md x"], "one at a time"),
    (["--spec-args", ""], "--spec-args"),
])
def test_bad_bench_input_is_one_line(tiny_deepseek4: Path, args: list[str], says: str) -> None:
    result = run_pyllm("bench", str(tiny_deepseek4), *args)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("binary", ["/nonexistent/llama-server", ".", ""])
def test_agents_baseline_binary_is_checked_before_anything_runs(tiny_deepseek4: Path, binary: str) -> None:
    result = run_pyllm("bench", "agents", str(tiny_deepseek4), "--baseline-binary", binary, "--concurrency", "1")
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and result.stdout == "", result.stderr
    assert f"llama-server binary {binary!r} is not an executable file" in result.stderr


def test_url_cannot_take_server_side_options() -> None:
    for args, says in ((["--verify-cost", "1-4"], "give a MODEL"), (["--parallel", "4", "--concurrency", "1,2"], "--parallel")):
        result = run_pyllm("bench", "--url", "http://127.0.0.1:9", *args)
        assert result.returncode == 1 and result.stderr.count("\n") == 1 and says in result.stderr, result.stderr


def test_projection_follows_the_formula() -> None:
    from pyllm_a100.bench.verify import VerifyCost, draft_ms_per_token, expected_tokens, projection

    assert expected_tokens(0.0, 7) == 1.0 and expected_tokens(1.0, 7) == 8.0 and expected_tokens(0.5, 1) == 1.5
    cost = VerifyCost(depth=512, decode_ms=10.0, rows=[{"k": k, "ms": 10.0 + k, "ratio": (10.0 + k) / 10} for k in range(1, 5)],
                      argv=[], repetitions=1)
    rows = projection(cost, acceptances=(0.5,), draft_ms_per_token=0.5)
    assert [r["k"] for r in rows] == [1, 2, 3]  # k drafted needs the k+1 forward measured
    r3 = rows[-1]
    assert r3["step_ms"] == 14.0 + 3 * 0.5 and abs(r3["speedup"] - expected_tokens(0.5, 3) * 10.0 / 15.5) < 1e-12
    assert draft_ms_per_token(6.0, cost, 3) == (6.0 - (14.0 - 10.0)) / 3 and draft_ms_per_token(1.0, cost, 3) == 0.0


def test_the_ceiling_is_the_best_length_over_its_cost() -> None:
    from pyllm_a100.bench.verify import ceiling, expected_tokens

    # DeepSeek-V4's real 256 experts: the weights a k-token forward reads (lab/results/gpu-multitoken-shapes.json)
    weights = {1: 1.0, 2: 1.209, 3: 1.414, 4: 1.613, 5: 1.81, 8: 2.366}
    d, x = ceiling(0.607, weights, 7)  # DSpark's published 2.5 tokens a step at 7 drafted
    assert d == 2 and x == pytest.approx(expected_tokens(0.607, 2) / 1.414) and 1.39 < x < 1.41
    assert ceiling(0.607, weights, 1) == (1, pytest.approx(expected_tokens(0.607, 1) / 1.209))  # capped by --draft-max
    assert ceiling(0.1, weights, 7) == (0, 1.0)  # nothing beats plain decoding: no draft
    assert ceiling(0.9, {}, 7) == (0, 1.0) and ceiling(0.9, {2: 0.0}, 7) == (0, 1.0)  # nothing measured
    assert ceiling(1.0, {k: 1.0 for k in range(1, 9)}, 7) == (7, 8.0)  # free verify, everything accepted


def test_sse_payloads_split_on_newlines_only() -> None:
    """A token that decodes to U+2028 or U+0085 sits unescaped in llama-server's JSON: it must not cut the line."""
    import httpx

    from pyllm_a100.bench.client import sse_data

    body = 'data: {"content": "a\u2028b\u0085c"}\n\ndata: {"stop": true}\n\n'.encode()
    payloads = [json.loads(d) for d in sse_data(httpx.Response(200, content=body))]
    assert payloads == [{"content": "a\u2028b\u0085c"}, {"stop": True}]
    assert len(list(httpx.Response(200, content=body).iter_lines())) > 4, "httpx's own line split would cut it"
