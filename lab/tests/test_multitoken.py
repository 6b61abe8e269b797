"""Issue 42's measurement tooling on the CPU: lab/bench/multitoken.py's parsing, projection, rows and renderer, the
report.py wiring into docs/performance.md, and python -m lab.runs.gpu_multitoken end to end over stand-in llama.cpp programs
(lab/tests/fakes.py) with native and A100-dispatch columns mixed in one run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.bench import multitoken as mt
from pyllm_a100.bench.throughput import BenchError
from pyllm_a100.models.roofline import distinct_experts
from lab.tests import fakes

REPO = Path(__file__).resolve().parents[2]
ROW_KEYS = {"model", "layers", "dispatch", "verify", "batched", "draft", "projection"}


def bench_json(ks, n, scale=1.0):
    out = [{"n_prompt": k, "n_gen": 0, "samples_ns": [int((10 + k) * scale * 1e6), int((10 + k) * scale * 1e6) + 2]} for k in ks if k > 1]
    return out + [{"n_prompt": 0, "n_gen": n, "samples_ns": [int(9.0 * n * scale * 1e6)] * 3}]


def test_verify_takes_k_1_from_the_decode_test_and_the_rest_from_the_prompt_tests() -> None:
    v = mt.verify_ms(bench_json([1, 2, 4], 16), [1, 2, 4], 16)
    assert v["k_ms"] == {1: 9.0, 2: pytest.approx(12.000001), 4: pytest.approx(14.000001)} and v["decode_ms"] == 9.0
    with pytest.raises(ValueError, match="k=\\[8\\]"):
        mt.verify_ms(bench_json([1, 2], 16), [1, 2, 8], 16)
    assert mt.verify_args([1, 2, 16], 512, 3, 16)[:8] == ["-p", "1,2,16", "-n", "16", "-d", "512", "-r", "3"]
    assert mt.verify_ms_means([{"k_ms": {"1": 10.0, "2": 12.0}}, {"k_ms": {"1": 12.0, "2": 14.0}}]) == {1: 11.0, 2: 13.0}


def test_sequence_counts() -> None:
    assert mt.parse_npl("1-32") == list(range(1, 33)) and mt.parse_npl("1,8,16,32") == [1, 8, 16, 32]
    for bad in ("0-4", "1,1", "", "600"):
        with pytest.raises(ValueError):
            mt.parse_npl(bad)


def test_draft_cost_is_the_step_difference_less_the_extra_verify() -> None:
    timings = [{"predicted_n": 65, "predicted_ms": 640.0, "draft_n": 448, "draft_n_accepted": 0}] * 2
    s = mt.step_ms(timings)
    assert s["steps"] == 128 and s["step_ms"] == 10.0 and s["drafted_per_step"] == 7.0
    verify = {1: 5.0, 8: 7.0}
    assert mt.draft_cost(5.5, 9.0, verify, 7.0) == pytest.approx(1.5)  # 3.5 more per step, 2.0 of it the verify of 8
    assert mt.draft_cost(5.5, 6.0, verify, 7.0) == 0.0 and mt.draft_cost(5.5, 9.0, verify, 0.2) is None


def test_projection_follows_speculative_py_and_stops_at_the_drafts_block() -> None:
    a = mt.acceptance(2.5, 7)
    assert mt.expected_tokens(a, 7) == pytest.approx(2.5, abs=1e-9) and 0.5 < a < 0.7
    verify = {k: 10.0 + 0.5 * (k - 1) for k in range(1, 17)}
    dspark = mt.projection(verify, 2.0, per_token=False, max_draft=7, measured_draft=7, accept_lens=(2.5,))
    assert [r["k"] for r in dspark] == list(range(1, 9)) and set(dspark[0]) == {"accept_len", "k", "plain_tps", "projected_tps"}
    assert dspark[0]["projected_tps"] == dspark[0]["plain_tps"] == 100.0
    k8 = next(r for r in dspark if r["k"] == 8)
    assert k8["projected_tps"] == pytest.approx(2.5 / (13.5 + 2.0) * 1000, rel=1e-3)
    mtp = mt.projection(verify, 7.0, per_token=True, max_draft=15, measured_draft=7, accept_lens=(2.9,))
    k3 = next(r for r in mtp if r["k"] == 3)  # two drafted tokens at 1 ms each
    assert len(mtp) == 16 and k3["projected_tps"] == pytest.approx(mt.expected_tokens(mt.acceptance(2.9), 2) / 13.0 * 1000, rel=1e-3)
    with pytest.raises(BenchError, match="between 1 and 8"):
        mt.acceptance(9.0, 7)


def synthetic() -> dict:
    verify, batched = {"v4-43l": {}, "v4-4l": {}}, {"v4-43l": {}}
    for col, scale in (("pin", 1.0), ("patched", 0.6), ("pin@a100", 1.03), ("patched@a100", 0.62)):
        verify["v4-43l"][col] = {k: (17.0 + 1.1 * (k - 1)) * scale for k in range(1, 17)}
        verify["v4-4l"][col] = {k: (1.8 + 0.2 * (k - 1)) * scale for k in range(1, 17)}
        batched["v4-43l"][col] = {n: 58.0 * n ** 0.7 / scale for n in (1, 2, 4, 8, 16, 24, 32)}
    drafts = {"dspark": {c: {"own_ms": 1.2, "drafted": 7.0} for c in verify["v4-4l"]},
              "mtp": {c: {"own_ms": 4.9, "drafted": 7.0} for c in verify["v4-4l"]}}
    rows = mt.rows({"v4-43l": ("deepseek-v4-flash", 43), "v4-4l": ("deepseek-v4-flash", 4)}, verify, batched, drafts,
                   projection_draft="dspark")
    return {"gpu": "NVIDIA H200, 580.159.04", "settings": {"depth": 512}, "projection_rule": mt.PROJECTION_RULE, "rows": rows}


def test_rows_have_exactly_the_agreed_shape() -> None:
    rows = synthetic()["rows"]
    assert [(r["layers"], r["dispatch"]) for r in rows] == [(43, "native"), (43, "a100"), (4, "native"), (4, "a100")]
    for r in rows:
        assert set(r) == ROW_KEYS and r["model"] == "deepseek-v4-flash"
        assert all(set(v) == {"k", "pin_ms", "patched_ms"} for v in r["verify"]) and len(r["verify"]) == 16
        assert all(set(b) == {"sequences", "pin_tps", "patched_tps"} for b in r["batched"])
        assert set(r["draft"]) == {"type", "pin_ms", "patched_ms"} and r["draft"]["type"] == "dspark"
        assert all(set(p) == {"accept_len", "k", "plain_tps", "projected_tps"} for p in r["projection"])
    a100 = rows[1]
    assert a100["verify"][0] == {"k": 1, "pin_ms": round(17.0 * 1.03, 3), "patched_ms": round(17.0 * 0.62, 3)}
    assert [b["sequences"] for b in a100["batched"]] == [1, 2, 4, 8, 16, 24, 32] and rows[2]["batched"] == []


def test_renderer_tables_and_the_not_measured_line() -> None:
    assert "not measured yet" in mt.render(None) and "not measured yet" in mt.render({"rows": []})
    text = mt.render(synthetic())
    assert "Multi-token steps on deepseek-v4-flash (43 layers" in text and "NVIDIA H200 running the sm_80 code" in text
    assert "| a100 | patched | 10.54 |" in text  # 17.0 x 0.62, the 1-token step of the 43-layer file
    assert "| native | pin | 17.00 | 1.06 | 1.19 | 1.45 | 1.97 |" in text  # k/1 ratios
    assert "| N=1 | N=8 | N=16 | N=32 |" in text and "| native | patched | 96.7 |" in text
    assert "dspark draft 1.20 ms per step (pin 1.20)" in text and "best projected (patched): accept length 2.5: k = " in text
    assert "Projection, not a measurement" in text and "4 layers" not in text  # the biggest file only


def report(tmp_path: Path, multitoken: Path | None, *extra: str) -> subprocess.CompletedProcess:
    perf = tmp_path / "performance.md"
    if not perf.exists():
        shutil.copy(REPO / "docs" / "performance.md", perf)
    return fakes.program("lab.benchmarks.report", "--write", str(tmp_path / "benchmarks.md"), "--performance", str(perf),
                         "--multitoken", str(multitoken or tmp_path / "none.json"), *extra, timeout=120)


def test_report_renders_the_section_between_the_markers_and_checks_it(tmp_path: Path) -> None:
    assert report(tmp_path, None).returncode == 0
    perf = (tmp_path / "performance.md").read_text()
    section = perf.split(mt.MULTITOKEN_TABLE[0])[1].split(mt.MULTITOKEN_TABLE[1])[0]
    assert "not measured yet" in section and "<!-- perf-table -->" in perf  # the other table stays
    data = tmp_path / "gpu-multitoken.json"
    data.write_text(json.dumps(synthetic()))
    assert report(tmp_path, data, "--check").returncode == 1  # the document still says "not measured yet"
    assert report(tmp_path, data).returncode == 0
    assert "| a100 | patched | 10.54 |" in (tmp_path / "performance.md").read_text()
    assert report(tmp_path, data, "--check").returncode == 0


def test_the_committed_docs_say_what_the_committed_results_give() -> None:
    perf = (REPO / "docs" / "performance.md").read_text()
    results = REPO / "lab" / "results" / "gpu-multitoken.json"
    assert mt.MULTITOKEN_TABLE[0] in perf
    expected = mt.render(json.loads(results.read_text()) if results.is_file() else None)
    assert perf.split(mt.MULTITOKEN_TABLE[0] + "\n")[1].split(mt.MULTITOKEN_TABLE[1])[0] == expected


def run(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return fakes.program("lab.runs.gpu_multitoken", *args, env=env, timeout=timeout)


@pytest.mark.parametrize("args,message", [(["--k", "0-4"], "--k"), (["--k", "2-4"], "must include 1"),
                                          (["--columns", "pin@h100"], "DISPATCH one of"),
                                          (["--models", "v4-99l"], "choose from"), (["--npl", "0,1"], "--npl"),
                                          (["--accept-lens", "9"], "accepted length 9"),
                                          (["--report-as", "cand=patched"], "ROLE=VALUE"),
                                          (["--shapes-into", "/"], "--shapes-into"),
                                          (["--shapes-into", "/no/such/folder/s.json"], "--shapes-into"),
                                          (["--alias", "nographs=patched"], "NAME=BUILD,VAR=VALUE"),
                                          (["--alias", "=patched,X=1"], "NAME=BUILD,VAR=VALUE"),
                                          (["--alias", "patched=patched,X=1"], "already a column's name"),
                                          (["--alias", "ng=patched,X=1", "--alias", "ng=pin,X=1"], "already a column's name")])
def test_bad_arguments_are_one_usage_error(args: list[str], message: str, tmp_path: Path) -> None:
    result = run("--work", str(tmp_path), *args, "report")
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_stages_over_stand_ins_mix_dispatches_in_one_run(tmp_path: Path) -> None:
    """warmup, verify and batched over stand-in llama-bench / llama-batched-bench in pin-bin and patched-bin, the four
    columns interleaved; the report's rows, each column's reported capability (8.0 only under the shim), commands."""
    work = tmp_path / "work"
    fakes.builds(work)
    shim = fakes.dummy_shim(tmp_path / "shim")
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    result = run("--work", str(work), "--dispatch-shim", str(shim), "--models", "v4-43l,v4-4l", "--k", "1-4", "--npl", "1,8,16,32",
                 "warmup", "verify", "batched", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "out" / "gpu-multitoken.json").read_text())
    assert data["reported_capability"] == {"pin": "9.0", "patched": "9.0", "pin@a100": "8.0", "patched@a100": "8.0"}
    assert all(not d.get("problem") for d in data["dispatch"].values())
    verify = json.loads((work / "mt" / "verify.json").read_text())
    assert [r["column"] for r in verify["runs"]][:8] == ["pin", "patched", "pin@a100", "patched@a100"] * 1 + \
        ["patched@a100", "pin@a100", "patched", "pin"]
    rows = {(r["layers"], r["dispatch"]): r for r in data["rows"]}
    assert set(rows) == {(43, "native"), (43, "a100"), (4, "native"), (4, "a100")}
    assert all(set(r) == ROW_KEYS | {"experts"} and r["experts"] == 16 for r in rows.values())  # the stand-in files: no weights
    v = {x["k"]: x for x in rows[(43, "a100")]["verify"]}
    assert v[1]["pin_ms"] == pytest.approx(10.0 * 1.02 * 1.01, rel=0.02) and v[4]["patched_ms"] < v[4]["pin_ms"]
    assert [b["sequences"] for b in rows[(43, "native")]["batched"]] == [1, 8, 16, 32]
    assert rows[(43, "native")]["draft"] == {"type": "dspark", "pin_ms": None, "patched_ms": None}  # not measured
    assert [p["k"] for p in rows[(43, "native")]["projection"]] == [1, 1]  # plain decoding only, without a draft cost
    programs = data["commands"]["programs"]["verify"]
    assert any("pin-bin/llama-bench" in c and "-d 512" in c for c in programs["pin@a100"])
    assert "lab.runs.gpu_multitoken" in data["commands"]["stages"]["verify"] and "draft" not in data["commands"]["stages"]
    assert "| a100 | patched |" in result.stdout  # the report stage prints the rendered section


def test_an_alias_runs_its_builds_programs_with_its_environment(tmp_path: Path) -> None:
    """--alias nographs=patched,GGML_CUDA_DISABLE_GRAPHS=1: a column that runs patched-bin's llama-bench with CUDA
    graphs off (the stand-in is 1.5x slower then), under either dispatch."""
    work = tmp_path / "work"
    fakes.builds(work)
    shim = fakes.dummy_shim(tmp_path / "shim")
    result = run("--work", str(work), "--dispatch-shim", str(shim), "--models", "v4-4l", "--k", "1,2",
                 "--alias", "nographs=patched,GGML_CUDA_DISABLE_GRAPHS=1", "--columns", "patched,nographs,nographs@a100",
                 "verify", env=dict(fakes.env_without_preload(), OUT=str(tmp_path / "out")))
    assert result.returncode == 0, result.stdout + result.stderr
    verify = json.loads((work / "mt" / "verify.json").read_text())
    ms = {r["column"]: r["k_ms"]["2"] for r in verify["runs"]}
    assert ms["nographs"] == pytest.approx(1.5 * ms["patched"]) and ms["nographs@a100"] == pytest.approx(1.02 * ms["nographs"])
    assert all("patched-bin/llama-bench" in c for c in verify["commands"]["nographs@a100"])
    assert verify["dispatch"]["nographs@a100"]["reported_capability"] == "8.0"


def test_gpu_ab_table_compares_two_builds_per_dispatch(tmp_path: Path) -> None:
    """gpu-ab-table over stage files in gpu-multitoken's format: B/A per k and per N, each dispatch apart."""
    mt_dir = tmp_path / "mt"
    mt_dir.mkdir()
    runs = [{"model": "v4-43l", "column": col, "order": i, "k_ms": {"1": base, "8": base * 2.5}}
            for i, (col, base) in enumerate([("prev", 10.0), ("patched", 10.0), ("prev@a100", 11.0), ("patched@a100", 11.0)])]
    runs.append({"model": "v4-43l", "column": "patched", "order": 4, "k_ms": {"1": 10.0, "8": 22.0}})
    (mt_dir / "verify.json").write_text(json.dumps({"depth": 512, "runs": runs}))
    (mt_dir / "batched.json").write_text(json.dumps({"npp": 64, "ntg": 16, "runs": [
        {"column": "prev", "order": 0, "tps": {"16": 400.0}}, {"column": "patched", "order": 1, "tps": {"16": 440.0}},
        {"column": "prev@a100", "order": 2, "error": "boom"}]}))
    out = tmp_path / "ab.json"
    p = fakes.program("lab.runs.gpu_ab_table", str(mt_dir), "--a", "prev", "--b", "patched", "--out", str(out), timeout=60)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    native = res["by_dispatch"]["native"]
    k8 = next(r for r in native["verify"] if r["k"] == 8)
    assert (k8["a_ms"], k8["b_ms"], k8["b_over_a"]) == (25.0, 23.5, 0.94)  # B: the mean of its two passes
    assert native["batched"] == [{"sequences": 16, "a_tps": 400.0, "b_tps": 440.0, "b_over_a": 1.1}]
    assert res["by_dispatch"]["a100"]["batched"] == []  # the failed A run leaves no pair
    assert "B/A 0.940" in p.stdout
    none = fakes.program("lab.runs.gpu_ab_table", str(mt_dir), "--a", "x", "--b", "y", timeout=60)
    assert none.returncode == 1 and "no run of both x and y" in none.stderr and not (tmp_path / "x").exists()


def test_weights_read_counts_each_touched_expert_once() -> None:
    dense = {"active_bytes": 1000, "expert_bytes": 0, "experts_used": 0, "experts": 0}
    assert [r["ratio"] for r in mt.weights_read(dense, [1, 8])] == [1.0, 1.0]  # no experts: k tokens read the same
    # 600 dense bytes + 6 of 16 experts at 100 bytes each per token
    moe = {"active_bytes": 1200, "expert_bytes": 1600, "experts_used": 6, "experts": 16}
    r = {x["k"]: x["ratio"] for x in mt.weights_read(moe, [1, 2, 8, 64])}
    assert r[1] == 1.0 and distinct_experts(16, 6, 1) == pytest.approx(6)
    assert r[2] == pytest.approx((600 + 100 * 16 * (1 - (10 / 16) ** 2)) / 1200, abs=1e-3)
    assert r[8] < r[64] <= (600 + 1600) / 1200  # never more than every expert once
    # the real expert count: 8 tokens touch ~44 of 256 experts, so the experts' share grows ~7x, not ~2.6x as with 16
    assert distinct_experts(256, 6, 8) == pytest.approx(44.3, abs=0.5) and distinct_experts(16, 6, 8) > 15.5


def shapes_data() -> dict:
    verify = {m: {c: {k: base * (1 + 0.1 * (k - 1)) * s for k in range(1, 17)}
                  for c, s in (("pin", 1.0), ("patched", 0.7), ("pin@a100", 1.02), ("patched@a100", 0.72))}
              for m, base in (("v4-4l-256", 2.0), ("v4-4l", 1.5), ("glm5-78l", 30.0))}
    models = {"glm5-78l": ("glm-5", 78, 16), "v4-4l": ("deepseek-v4-flash", 4, 16), "v4-4l-256": ("deepseek-v4-flash", 4, 256)}
    weights = {"v4-4l-256": {"active_bytes": 1200, "expert_bytes": 25600, "experts_used": 6, "experts": 256}}
    rows = mt.rows(models, verify, {}, {}, projection_draft="dspark", weights=weights)
    return {"gpu": "NVIDIA H200, 580", "rows": rows}


def test_shapes_rows_and_their_section() -> None:
    rows = shapes_data()["rows"]
    assert [(r["model"], r["layers"], r["experts"], r["dispatch"]) for r in rows][:3] == [
        ("glm-5", 78, 16, "native"), ("glm-5", 78, 16, "a100"), ("deepseek-v4-flash", 4, 16, "native")]
    assert all(set(r) == ROW_KEYS | {"experts"} for r in rows if r["experts"] == 16)
    real = [r for r in rows if r["experts"] == 256]
    assert len(real) == 2 and all(len(r["weights_read"]) == 16 for r in real)
    text = mt.render_shapes(shapes_data())
    assert "| glm-5 | 78 | 16 | a100 | patched | 21.60 | 1.10 | 1.30 | 1.60 | 1.70 | 2.50 |" in text
    assert text.count("| weights read |") == 1 and "| deepseek-v4-flash | 4 | 256 | - | weights read | - |" in text
    assert "not measured yet" in mt.render_shapes(None) and "not measured yet" in mt.render_shapes({"rows": []})
    only_patched = shapes_data()
    for r in only_patched["rows"]:
        r["verify"] = [dict(v, pin_ms=None) for v in r["verify"]]
    assert "| pin |" not in mt.render_shapes(only_patched) and "| a100 | patched |" in mt.render_shapes(only_patched)


def test_ceilings_take_the_best_width_against_the_weights_read_and_against_the_measured_step() -> None:
    from pyllm_a100.bench.draft_length import acceptance_for
    from pyllm_a100.bench.draft_costs import expected_tokens

    rows = shapes_data()["rows"]
    items = mt.ceilings(rows)
    # only the file whose weights the run recorded; one item per published accepted length
    assert [(c["experts"], c["accept_len"]) for c in items] == [(256, 2.5), (256, 2.9)]
    w = {x["k"]: x["ratio"] for x in mt.weights_read(
        {"active_bytes": 1200, "expert_bytes": 25600, "experts_used": 6, "experts": 256}, range(1, 17))}
    for c in items:
        a = acceptance_for(c["accept_len"], 7)
        gains = {k: expected_tokens(a, k - 1) / w[k] for k in range(2, 9)}  # k <= 8: DSpark's block of 7
        best = max(gains, key=gains.get)
        assert c["bound"] == {"k": best, "x": round(gains[best], 2)}
        measured = {k: expected_tokens(a, k - 1) / (1 + 0.1 * (k - 1)) for k in range(2, 9)}  # shapes_data's k/1
        best = max(measured, key=measured.get)
        assert c["measured"]["native"] == c["measured"]["a100"] == {"k": best, "x": round(measured[best], 2),
                                                                      "build": "patched"}
    # a cheaper step per token widens the best k; the bound never credits more than E(a, k - 1) per unit of weights
    assert items[1]["bound"]["x"] > items[0]["bound"]["x"] and all(c["bound"]["x"] < 8 for c in items)
    text = mt.render_shapes(shapes_data())
    assert "| model | layers | experts | tokens a step (accept length) | bound | measured, native | measured, a100 |" in text
    assert text.count("| deepseek-v4-flash | 4 | 256 | 2.") == 2
    no_weights = [dict(r, weights_read=None) for r in rows]
    assert mt.ceilings(no_weights) == [] and "tokens a step" not in mt.render_shapes({"gpu": "x", "rows": no_weights})


def test_the_committed_shapes_section_says_what_the_committed_results_give(tmp_path: Path) -> None:
    perf = (REPO / "docs" / "performance.md").read_text()
    results = REPO / "lab" / "results" / "gpu-multitoken-shapes.json"
    expected = mt.render_shapes(json.loads(results.read_text()) if results.is_file() else None)
    assert perf.split(mt.MULTITOKEN_SHAPES[0] + "\n")[1].split(mt.MULTITOKEN_SHAPES[1])[0] == expected
    data = tmp_path / "shapes.json"
    data.write_text(json.dumps(shapes_data()))
    assert report(tmp_path, None, "--multitoken-shapes", str(data)).returncode == 0
    assert "| glm-5 | 78 | 16 | a100 | patched |" in (tmp_path / "performance.md").read_text()


def test_verify_keeps_the_other_files_runs_and_records_weights(tmp_path: Path) -> None:
    """Two verify runs, one file each (the first file deleted in between, as the GPU session does for disk): the report
    has both files' rows; a real GGUF's weights per token give its weights_read rows, a stand-in's none."""
    from pyllm_a100.synth import synthesize

    work = tmp_path / "work"
    fakes.builds(work)
    synthesize("tiny-deepseek4", work / "v4-4l.gguf", seed=42)  # a real MoE file where v4-4l is expected
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    for model in ("v4-4l", "v4-43l"):
        result = run("--work", str(work), "--columns", "pin,patched", "--models", model, "--k", "1-4", "verify", env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        (work / f"{model}.gguf").unlink()
    verify = json.loads((work / "mt" / "verify.json").read_text())
    assert {r["model"] for r in verify["runs"]} == {"v4-4l", "v4-43l"}
    assert verify["weights"]["v4-4l"]["experts"] > verify["weights"]["v4-4l"]["experts_used"] > 0
    assert "error" in verify["weights"]["v4-43l"]  # the stand-in "GGUF" file has no header to read
    rows = {r["layers"]: r for r in json.loads((tmp_path / "out" / "gpu-multitoken.json").read_text())["rows"]}
    assert set(rows) == {43, 4} and "weights_read" not in rows[43]
    ratios = [x["ratio"] for x in rows[4]["weights_read"]]
    assert [x["k"] for x in rows[4]["weights_read"]] == [1, 2, 3, 4] and ratios[0] == 1.0 and ratios == sorted(ratios) and ratios[3] > 1


def test_roles_name_a_candidate_against_the_series_and_labels_say_which() -> None:
    roles = mt.parse_roles("pin=patched,patched=cand")
    assert roles == {"pin": "patched", "patched": "cand"} and mt.parse_roles("") == {}
    for bad in ("cand=patched", "pin", "pin=", "patched=cand,x=y"):
        with pytest.raises(ValueError, match="ROLE=VALUE"):
            mt.parse_roles(bad)
    cols = {"patched": {1: 2.0}, "cand": {1: 1.0}, "patched@a100": {1: 2.2}, "cand@a100": {1: 1.1}, "pin": {1: 9.0}}
    assert mt.as_roles(cols, roles) == {"pin": {1: 2.0}, "patched": {1: 1.0}, "pin@a100": {1: 2.2}, "patched@a100": {1: 1.1}}
    assert mt.as_roles(cols, {}) == cols
    rows = mt.rows({"v4-4l-256": ("deepseek-v4-flash", 4, 256)}, {"v4-4l-256": mt.as_roles(
        {c: {1: v[1], 8: v[1] * 2} for c, v in cols.items()}, roles)}, {}, {}, projection_draft="dspark",
        labels={"pin": "0001-0036", "patched": "0001-0038"})
    assert [r["labels"] for r in rows] == [{"pin": "0001-0036", "patched": "0001-0038"}] * 2
    text = mt.render_shapes({"gpu": "NVIDIA H200, 1", "rows": rows})
    assert "| deepseek-v4-flash | 4 | 256 | native | 0001-0036 | 2.00 |" in text and "| a100 | 0001-0038 | 1.10 |" in text


def test_merged_shapes_replace_rows_of_the_same_file_and_keep_each_runs_fields() -> None:
    old = shapes_data()
    old.update(started="t13", gpu="NVIDIA H200, 580", commands={"stages": {"verify": "thirteenth"}})
    new_row = dict(old["rows"][-1], verify=[{"k": 1, "pin_ms": 1.0, "patched_ms": 1.0}])
    run = {"started": "t14", "gpu": "NVIDIA H200, 580", "commands": {"stages": {"verify": "fourteenth"}}, "rows": [new_row]}
    merged = mt.merge_shapes(old, run)
    key = (new_row["model"], new_row["layers"], new_row["experts"], new_row["dispatch"])
    same_file = [r for r in merged["rows"] if (r["model"], r["layers"], r["experts"]) == key[:3]]
    assert same_file == [dict(new_row, started="t14", gpu="NVIDIA H200, 580")]  # both dispatches' old rows gone
    assert len(merged["rows"]) == len(old["rows"]) - 2 + 1  # the file's native and a100 rows -> the run's one row
    assert merged["runs"]["t13"]["commands"]["stages"]["verify"] == "thirteenth"
    assert merged["runs"]["t14"]["commands"]["stages"]["verify"] == "fourteenth" and merged["started"] == "t14"
    again = mt.merge_shapes(merged, dict(run, started="t15"))
    assert set(again["runs"]) == {"t13", "t14", "t15"} and "runs" not in again["runs"]["t15"]


def test_probe_serves_each_variant_and_compares_the_greedy_tokens(tmp_path: Path) -> None:
    """The probe stage over the real CPU build of this checkout's llama-server (the installed package's): the tiny
    DeepSeek-V4 as the draft target and its DSpark draft; a variant's KEY=VALUE words go to the server's environment,
    not its argv (else llama-server would refuse the word and the variant would record an error)."""
    from pyllm_a100.llamacpp.native import native_dir
    from pyllm_a100.synth import synthesize

    work = tmp_path / "work"
    work.mkdir()
    (work / "patched-bin").symlink_to(native_dir())
    synthesize("tiny-deepseek4", work / "v4-4l.gguf", seed=42)
    synthesize("tiny-deepseek4-dspark", work / "v4-4l-dspark.gguf", seed=42)
    dspark = "--spec-draft-model {dspark} --spec-type draft-dspark --spec-draft-p-min 0 --spec-draft-n-max"
    probe = f"plain=;plain-env=GGML_CUDA_DISABLE_GRAPHS=1;dspark3={dspark} 3;dspark7={dspark} 7"
    env = dict(fakes.env_without_preload(), OUT=str(tmp_path / "out"))
    result = run("--work", str(work), "--columns", "patched", "--draft-tokens", "24", "--draft-requests", "1",
                 "--probe", probe, "probe", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((work / "mt" / "probe.json").read_text())
    col = data["columns"]["patched"]
    assert list(col) == ["plain", "plain-env", "dspark3", "dspark7"] and not any("error" in v for v in col.values()), col
    assert col["plain"]["drafted"] == 0 and 0 < col["dspark3"]["drafted_per_step"] < col["dspark7"]["drafted_per_step"] <= 7
    assert data["tokens_equal"] and len({v["tokens_sha1"] for v in col.values()}) == 1  # the CPU: exact in every variant
    # the server's count of reused decode graphs, cumulative per request (warm-up + 1 request here): plain decoding
    # reuses nearly every step's graph
    assert all(len(v["graphs_reused"]) == 2 for v in col.values()), col
    assert col["plain"]["graphs_reused"][-1] - col["plain"]["graphs_reused"][0] >= 20, col["plain"]
    assert "probe: greedy tokens equal in every variant and column: True" in result.stdout
