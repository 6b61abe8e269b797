"""pyllm doctor MODEL --gpus: the memory plan per quantization, checked against llama-server's own buffers.

Presets are planned from synth's plan (nothing written), local files from their headers, hub repos from the
loopback hub's listing and a Range-read header; the estimate of a served file is compared with the buffer
sizes the real llama-server logs on this CPU build.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_pyllm
from hub import FakeHub
from pyllm_a100.errors import EX_CONFIG  # pyllm serve's exit status for configuration errors


def plan_json(*args: str, env: dict | None = None) -> dict:
    result = run_pyllm("doctor", *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_glm5_preset_plan_on_eight_a100s_at_131072_tokens_times_4_slots() -> None:
    plan = plan_json("glm-5", "--gpus", "8x80", "--ctx-per-slot", "131072", "--parallel", "4")
    from pyllm_a100.synth import WEIGHT_TYPES

    rows = {r["label"]: r for r in plan["rows"]}
    assert set(rows) == set(WEIGHT_TYPES) and plan["ctx_total"] == 524288 and plan["architecture"] == "glm-dsa"
    # MLA K rows (kv_lora 512 + rope 64) and the DSA indexer's keys (128) on all 78 layers, F16, 4 x 131072 cells
    want_kv = 78 * (512 + 64 + 128) * 2 * 4 * 131072
    for r in rows.values():
        assert r["kv_bytes"] == want_kv and r["compute_bytes"] > 0 and len(r["devices"]) == 8
        assert sum(d["layers"] for d in r["devices"]) == 78
        assert r["fits"] == (r["max_device_bytes"] <= (80 << 30) - (1 << 30))
    assert rows["ud-q8-k-xl"]["fits"] and rows["nvfp4-mix"]["fits"] and not rows["q8_0"]["fits"]
    assert rows["ud-q8-k-xl"]["serve"] == "pyllm serve glm-5-ud-q8-k-xl.gguf --tensor-split 1x8 --ctx-size 524288 --parallel 4"
    assert rows["q8_0"]["serve"] is None and "GPUs of 80 GiB" in rows["q8_0"]["note"]
    assert any("NVFP4" in f["text"] for f in plan["findings"])
    text = run_pyllm("doctor", "glm-5", "--gpus", "8x80", "--ctx-per-slot", "131072", "--parallel", "4")
    assert text.returncode == 0 and "ud-q8-k-xl" in text.stdout and "--ctx-size 524288 --parallel 4" in text.stdout


def test_deepseek_v4_flash_plan_counts_its_compressed_caches() -> None:
    plan = plan_json("deepseek-v4-flash", "--gpus", "8x80", "--ctx-per-slot", "131072", "--parallel", "4")
    rows = {r["label"]: r for r in plan["rows"]}
    assert "nvfp4-mix" not in rows, "deepseek4's graph ignores NVFP4 scales: no such row"
    ud = rows["ud-q8-k-xl"]
    assert ud["fits"] and ud["serve"].endswith("--tensor-split 1x8 --ctx-size 524288 --parallel 4")
    # window + CSA (1/4) + HCA (1/128) + indexer caches: far below a full 512-wide cache of every cell
    full = 43 * 512 * 2 * 4 * 131072
    assert 0 < ud["kv_bytes"] < full / 3


def test_a_too_big_rows_note_gives_the_weights_columns_number() -> None:
    """doctor's f32 row said 1059.2 GiB of weights and its note "1057 GiB" (the part on the GPUs): one number now."""
    rows = {r["label"]: r for r in plan_json("deepseek-v4-flash", "--gpus", "8x80")["rows"]}
    f32 = rows["f32"]
    assert not f32["fits"]
    column = f"{f32['weight_bytes'] / 2**30:.1f}"
    on_gpus = f"{(f32['weight_bytes'] - f32['host_bytes']) / 2**30:.1f}"
    assert f32["note"].startswith(f"weights alone need {column} GiB, {on_gpus} GiB of it on the GPUs"), f32["note"]


def test_a_model_that_does_not_fit_at_the_context_gets_a_smaller_one() -> None:
    plan = plan_json("glm-5", "--gpus", "8x80", "--ctx-per-slot", "202752", "--parallel", "16")
    ud = {r["label"]: r for r in plan["rows"]}["ud-q8-k-xl"]
    assert not ud["fits"] and ud["serve"] and "tokens per slot, not 202752" in ud["note"]


def test_more_than_the_trained_context_and_gpus_too_small_for_anything_are_said() -> None:
    over = run_pyllm("doctor", "glm-5", "--gpus", "8x80", "--ctx-per-slot", "1048576")
    assert over.returncode == 1 and over.stderr.count("\n") == 1 and "trained context (202752" in over.stderr
    tiny = {r["label"]: r for r in plan_json("tiny-glm-dsa", "--gpus", "2x1")["rows"]}["f16"]
    assert not tiny["fits"] and "a 1 GiB GPU holds nothing" in tiny["note"]


@pytest.mark.parametrize("bad", ["8x", "x80", "0x80", "8x0", "abc", "8x80x2", "-1x80"])
def test_bad_gpus_values_are_one_line_errors(bad: str) -> None:
    result = run_pyllm("doctor", "glm-5", "--gpus", bad)
    assert result.returncode == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--gpus" in lines[0] and "Traceback" not in result.stderr, result.stderr


def test_plan_arguments_are_checked() -> None:
    assert "at least 1" in run_pyllm("doctor", "glm-5", "--gpus", "8x80", "--parallel", "0").stderr
    assert "positive" in run_pyllm("doctor", "glm-5", "--gpus", "8x80", "--ctx-per-slot", "-5").stderr
    for missing in ("./nofile.gguf", "dir/nofile.gguf", "/abs/nofile.gguf"):
        gone = run_pyllm("doctor", missing, "--gpus", "8x80")
        assert gone.returncode == 1 and "does not exist" in gone.stderr and "Traceback" not in gone.stderr, gone.stderr
    no_gpus = run_pyllm("doctor", "glm-5", "--parallel", "4")
    assert no_gpus.returncode == 1 and "--gpus COUNTxGIB" in no_gpus.stderr


def test_local_file_estimate_within_10_percent_of_llama_servers_buffers(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """The real llama-server on this CPU build: model, KV and compute buffers as it logs them vs the estimate."""
    from lab.bench.memcheck import measure

    for ctx, slots in ((2048, 4), (8192, 2)):
        result = measure(tiny_models["tiny-glm-dsa"], ctx, slots, log_path=tmp_path / f"s-{ctx}.log")
        (cpu,) = result["devices"]
        assert cpu["device"] == "CPU" and cpu["logged_mib"]["kv"] > 0 and result["tokens"] == 8
        assert cpu["error_pct"]["weights"] == 0.0 and cpu["error_pct"]["kv"] == 0.0, cpu
        assert abs(cpu["error_pct"]["buffers"]) <= 10.0, cpu
        assert result["worst_error_pct"] <= 10.0
    # doctor shows llama-fit-params' own figure beside ours for a file
    plan = plan_json(str(tiny_models["tiny-glm-dsa"]), "--gpus", "1x8", "--ctx-per-slot", "2048", "--parallel", "4")
    (row,) = plan["rows"]
    assert plan["source"] == "file" and row["llama_fit_mib"]["Host"]["context"] == round(row["kv_bytes"] / 2**20)


def test_estimate_is_no_pass_when_nothing_was_logged(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100.models.gguf_files import resolve_model
    from pyllm_a100.planning.memplan import estimate_vs_measured, local_shape

    shape = local_shape(resolve_model(tiny_models["tiny-glm-dsa"]))
    assert estimate_vs_measured(shape, "no buffer lines here", 2048, 1)["worst_error_pct"] is None
    two = estimate_vs_measured(shape, "", 2048, 1, 2, used_mib=[900.0, 950.0])
    assert [d["device"] for d in two["devices"]] == ["CUDA0", "CUDA1"] and two["devices"][1]["measured_used_mib"] == 950.0


def test_hub_repo_is_planned_from_its_listing_and_a_range_read_header(tmp_path: Path, pyllm_home: Path) -> None:
    from pyllm_a100.synth import synthesize

    hub = FakeHub()
    try:
        files = {}
        for wtype, folder in (("q8_0", "Q8_0"), ("ud-q8-k-xl", "UD-Q8_K_XL")):
            out = tmp_path / folder
            result = synthesize("tiny-glm-dsa", out / "tiny-glm.gguf", weight_type=wtype, split_max_size="10M", seed=1)
            assert len(result.paths) >= 2
            files.update({f"{folder}/{p.name}": p.read_bytes() for p in result.paths})
        files["README.md"] = b"tiny"
        hub.add_repo("test/tiny-glm-GGUF", files)
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1",
                   HF_HUB_DISABLE_TELEMETRY="1", PYLLM_HOME=str(pyllm_home))
        plan = plan_json("test/tiny-glm-GGUF", "--gpus", "2x4", "--ctx-per-slot", "4096", "--parallel", "2", env=env)
        rows = {r["label"]: r for r in plan["rows"]}
        assert set(rows) == {"Q8_0", "UD-Q8_K_XL"} and plan["source"] == "hub"
        for folder, r in rows.items():
            listed = sum(len(b) for p, b in files.items() if p.startswith(folder + "/"))
            assert abs(r["weight_bytes"] - listed) < listed * 0.02  # the files less their headers
            assert r["kv_bytes"] == 3 * (512 + 64 + 128) * 2 * 2 * 4096 and r["fits"]
            assert r["serve"] == f"pyllm serve test/tiny-glm-GGUF:{folder} --tensor-split 1x2 --ctx-size 8192 --parallel 2"
        ranged = [h for m, p, h in hub.requests if m == "GET" and "/resolve/" in p]
        assert ranged and all(h.get("Range", "").startswith("bytes=0-") for h in ranged)
        fetched = {p.split("/resolve/")[1].split("/", 1)[1] for m, p, h in hub.requests if "/resolve/" in p}
        assert len(fetched) == 2 and all("-00001-of-" in p for p in fetched), fetched  # shard 1 of each set, nothing else
        missing = run_pyllm("doctor", "test/no-such-repo", "--gpus", "2x1", env=env)
        assert missing.returncode == 1 and "not found" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    finally:
        hub.close()


def test_nvfp4_mix_loads_serves_and_quantizes_the_f16_values(tmp_path: Path) -> None:
    """NVFP4 routed experts (per-expert scale_2) + Q8_0: llama-server's temperature-0 tokens equal in-process ones
    (both with flash attention), and the logits stay close to the f16 file of the same seed."""
    import gguf
    import httpx
    import numpy as np

    from pyllm_a100 import Llama, Server
    from pyllm_a100.synth import synthesize

    nv = synthesize("tiny-glm-dsa", tmp_path / "nv.gguf", weight_type="nvfp4-mix", seed=3).first
    f16 = synthesize("tiny-glm-dsa", tmp_path / "f16.gguf", seed=3).first
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(nv).tensors}
    assert types["blk.1.ffn_down_exps.weight"] == "NVFP4" and types["blk.1.ffn_down_exps.scale"] == "F32"
    assert types["blk.1.attn_q_b.weight"] == "Q8_0"
    prompt = [0, 271, 289, 300, 500, 700, 900]
    with Server(nv, port=0, ctx_size=512, log_path=tmp_path / "nv.log") as srv:
        served = httpx.post(srv.base_url + "/completion", timeout=120, json={
            "prompt": prompt, "n_predict": 12, "temperature": 0, "return_tokens": True, "ignore_eos": True}).json()["tokens"]

    def local(path: Path) -> tuple[list[int], np.ndarray]:
        llm = Llama(path, n_ctx=512, logits_all=True, flash_attn=True, verbose=False)
        try:
            llm.eval(prompt)
            scores = np.array(llm.scores[:len(prompt)], dtype=np.float64)
            llm.reset()
            tokens = []
            for token in llm.generate(prompt, temp=0, top_k=1):
                tokens.append(token)
                if len(tokens) == 12:
                    break
            return tokens, scores
        finally:
            llm.close()

    tokens, a = local(nv)
    _, b = local(f16)
    assert tokens == served
    nmse = float(((a - b) ** 2).sum() / (b ** 2).sum())
    assert 1e-6 < nmse < 2e-2, nmse  # FP4 experts differ from f16, but by quantization error only
    report = run_pyllm("doctor", str(nv))
    assert report.returncode == 0 and "NVFP4 tensors" in report.stdout


def test_nvfp4_mix_is_refused_for_deepseek4_in_one_line(tmp_path: Path) -> None:
    result = run_pyllm("synth", "tiny-deepseek4", "-o", str(tmp_path / "x.gguf"), "--type", "nvfp4-mix")
    assert result.returncode == 1 and "ignores NVFP4's per-expert scales" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_quantize_nvfp4_matches_ggmls_reference_decoding() -> None:
    """Our NVFP4 encoder against the gguf package's decoder: values within half a level of each sub-block's grid."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    from pyllm_a100.synth import quantize_nvfp4

    x = np.random.default_rng(0).standard_normal(64 * 512).astype(np.float32) * 3
    x[:16] = 0.0  # an all-zero sub-block: scale 0, values 0
    y = dequantize(quantize_nvfp4(x), T.NVFP4).ravel()
    assert (y[:16] == 0).all()
    rel = float(((x - y) ** 2).sum() / (x ** 2).sum())
    assert 1e-3 < rel < 2e-2, rel
    assert (np.sign(y[np.abs(y) > 0]) == np.sign(x[np.abs(y) > 0])).all()


def test_remote_header_longer_than_the_first_range_is_read_again_with_twice_the_range(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    from conftest import run_python

    hub = FakeHub()
    try:
        hub.add_repo("test/one", {"m.gguf": tiny_models["tiny-glm-dsa"].read_bytes(), "bad.gguf": b"NOPE" * 100})
        code = ("from pyllm_a100.models import gguf_remote\n"
                "gguf_remote.RANGE_START = 4096\n"
                "h = gguf_remote.remote_header('test/one', 'm.gguf')\n"
                "print(h.metadata['general.architecture'], h.tensor_count)\n"
                "try:\n    gguf_remote.remote_header('test/one', 'bad.gguf')\n"
                "except Exception as e:\n    print(type(e).__name__, e)\n")
        result = run_python(code, env=dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf")))
        assert result.returncode == 0, result.stderr
        first, second = result.stdout.strip().splitlines()
        assert first.startswith("glm-dsa ") and int(first.split()[1]) > 10
        assert second.startswith("FetchError") and "not a GGUF file" in second
        ranges = [h["Range"] for m, p, h in hub.requests if p.endswith("/m.gguf") and m == "GET"]
        assert ranges[0] == "bytes=0-4095" and len(ranges) >= 3 and ranges[1] == "bytes=0-8191", ranges
    finally:
        hub.close()


def test_a_tensor_type_unknown_to_the_build_is_refused_before_llama_cpp_starts(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """As NVFP4 (type 40) read by an older llama.cpp: ggml's parser names the tensor and type; serve/doctor say so."""
    import struct

    data = bytearray(tiny_models["tiny-llama"].read_bytes())
    name = b"token_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    assert struct.unpack_from("<I", data, type_at)[0] == 1  # F16
    struct.pack_into("<I", data, type_at, 99)
    bad = tmp_path / "future-type.gguf"
    bad.write_bytes(bytes(data))
    for args in (["doctor", str(bad)], ["serve", str(bad), "--port", "0"]):
        result = run_pyllm(*args, timeout=60)
        assert result.returncode == (EX_CONFIG if args[0] == "serve" else 1) and "GGML type 99" in result.stderr and "token_embd.weight" in result.stderr, result.stderr
        assert "truncated" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_estimate_is_within_ten_percent_of_the_gpu_run() -> None:
    """Issue 18's criterion on the committed 2x H200 run of the real-shape GLM-5 (lab.runs.gpu_check --only glm5, cf107d3):
    the estimate for the same file, context and slots against NVML's used memory per GPU."""
    import json

    from pyllm_a100.planning import memplan

    run = json.loads((Path(__file__).resolve().parents[1] / "lab" / "results" / "gpu-check-2026-11-30-glm5.json")
                     .read_text())["steps"]["glm5"]["result"]
    m = run["model"]
    shape = next(s for s in memplan.preset_shapes(m["preset"], layers=m["layers"], experts=m["experts"]) if s.label == m["type"])
    assert shape.weight_bytes == pytest.approx(m["bytes"], rel=0.01), "the plan is of the file that was served"
    result = memplan.estimate_vs_buffers(shape, run["buffers_mib"], run["ctx_size"] // run["parallel"],
                                         run["parallel"], 2, used_mib=run["memory_used_by_server_mib"])
    gpus = [d for d in result["devices"] if d["device"].startswith("CUDA")]
    assert len(gpus) == 2 and result["worst_error_pct"] is not None and result["worst_error_pct"] <= 10
    assert all(abs(d["error_pct"]["weights"]) < 0.5 and abs(d["error_pct"]["kv"]) < 0.5 for d in gpus)


def test_logged_buffers_keeps_each_rpc_worker_apart() -> None:
    """llama-server -lv 4 with two CPU rpc-workers (the CPU build, tiny-deepseek4): every worker's device is RPC0 on
    its own machine, so the buffer's name carries the endpoint."""
    from pyllm_a100.planning.memplan import logged_buffers

    log = """load_tensors:   CPU_Mapped model buffer size =     1.00 MiB
load_tensors: RPC0[127.0.0.1:50993] model buffer size =    24.65 MiB
load_tensors: RPC0[127.0.0.1:50994] model buffer size =     8.80 MiB
llama_kv_cache: RPC0[127.0.0.1:50993] KV buffer size =     0.75 MiB
llama_kv_cache: RPC0[127.0.0.1:50994] KV buffer size =     0.25 MiB
llama_kv_cache: RPC0[127.0.0.1:50993] KV buffer size =     0.12 MiB
"""
    found = logged_buffers(log)
    assert found["RPC0[127.0.0.1:50993]"]["model"] == 24.65 and found["RPC0[127.0.0.1:50994]"]["model"] == 8.80
    assert found["RPC0[127.0.0.1:50993]"]["kv"] == 0.87 and found["CPU"]["model"] == 1.0
