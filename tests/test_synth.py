"""Synthetic models: loadable by the real llama.cpp, reproducible, sharded, real-shape layouts."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import gguf
import pytest

from pyllm_a100 import synth
from pyllm_a100.models.gguf_files import resolve_model

from conftest import TINY_PRESETS, run_pyllm


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = synth.synthesize("tiny-deepseek4", tmp_path / "a.gguf", seed=7).first
    b = synth.synthesize("tiny-deepseek4", tmp_path / "b.gguf", seed=7).first
    c = synth.synthesize("tiny-deepseek4", tmp_path / "c.gguf", seed=8).first
    assert sha256(a) == sha256(b)
    assert sha256(a) != sha256(c) and a.stat().st_size == c.stat().st_size


@pytest.mark.parametrize("weight_type", synth.WEIGHT_TYPES)
def test_every_weight_type_writes_finite_values_and_loads(weight_type: str, tmp_path: Path) -> None:
    from pyllm_a100 import Llama

    preset = "tiny-glm-dsa" if weight_type == "nvfp4-mix" else "tiny-deepseek4"  # deepseek4 ignores NVFP4's scales
    path = synth.synthesize(preset, tmp_path / "m.gguf", weight_type=weight_type, seed=1).first
    reader = gguf.GGUFReader(path)
    from gguf.quants import dequantize

    for tensor in reader.tensors:
        if tensor.tensor_type.name in ("I32",):
            continue
        values = dequantize(tensor.data, tensor.tensor_type)
        assert values.size and bool(abs(values).max() < 1e4) and not (values != values).any(), tensor.name
    expected = {"ud-q8-k-xl": {"MXFP4", "Q8_0", "F32", "I32"}, "q8_0": {"Q8_0", "F32", "I32"},
                "q4_0": {"Q4_0", "F32", "I32"}, "f16": {"F16", "F32", "I32"}, "bf16": {"BF16", "F32", "I32"},
                "f32": {"F32", "I32"}, "nvfp4-mix": {"NVFP4", "Q8_0", "F32"}}[weight_type]
    assert {t.tensor_type.name for t in reader.tensors} == expected
    llm = Llama(path, n_ctx=128, verbose=False)
    try:
        assert len("".join(llm.generate("Hi", max_tokens=3, temperature=0))) >= 0
        assert llm.n_tokens > 1
    finally:
        llm.close()


def test_ud_mix_puts_experts_in_mxfp4_and_norms_and_hyper_connections_in_f32() -> None:
    the_plan = synth.plan("deepseek-v4-flash", 4)
    types = {t.name: synth.ggml_type_for(t, "ud-q8-k-xl").name for t in the_plan.tensors}
    assert types["blk.3.ffn_down_exps.weight"] == "MXFP4"
    assert types["blk.3.attn_q_b.weight"] == "Q8_0"
    assert types["blk.3.attn_norm.weight"] == "F32" and types["blk.3.hc_ffn_fn.weight"] == "F32"
    assert types["blk.0.ffn_gate_tid2eid.weight"] == "I32"


def test_fewer_experts_keep_the_layers_and_the_work_per_token(tmp_path: Path) -> None:
    from pyllm_a100 import Llama

    full = synth.synthesize("tiny-deepseek4", tmp_path / "full.gguf", seed=3)
    fewer = synth.synthesize("tiny-deepseek4", tmp_path / "fewer.gguf", experts=4, seed=3)
    assert fewer.bytes_written < full.bytes_written and fewer.layers == full.layers == 4
    reader = gguf.GGUFReader(fewer.first)
    assert reader.fields["deepseek4.expert_count"].contents() == 4
    assert reader.fields["deepseek4.expert_used_count"].contents() == 2
    tensors = {t.name: t for t in reader.tensors}
    assert list(tensors["blk.3.ffn_up_exps.weight"].shape)[-1] == 4
    assert int(tensors["blk.0.ffn_gate_tid2eid.weight"].data.max()) < 4  # hash routing only names existing experts
    llm = Llama(fewer.first, n_ctx=128)
    try:
        assert len(list(llm.generate("Hi", max_tokens=4, temperature=0))) >= 1
    finally:
        llm.close()


def test_utf8_text_round_trips_through_the_synthetic_tokenizer(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100 import Llama

    llm = Llama(tiny_models["tiny-llama"], vocab_only=True)
    try:
        for text in ["Hello, world!", "Grüße aus Zürich", "你好，世界", "emoji 🚀🙂", "mixed ünï 世 🚀 code\n\tdef f(): pass"]:
            tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
            assert llm.detokenize(tokens).decode() == text
        # learned merges make common words single tokens, as a real BPE does
        assert len(llm.tokenize(b" the", add_bos=False)) == 1
        special = llm.tokenize("<｜User｜>hi<｜Assistant｜>".encode(), add_bos=False, special=True)
        assert len(special) <= 4
    finally:
        llm.close()


def test_three_shard_set_has_split_keys_and_loads_from_shard_one(tmp_path: Path) -> None:
    from pyllm_a100 import Llama

    result = synth.synthesize("tiny-deepseek4", tmp_path / "tiny.gguf", split_max_size="12M", seed=42)
    assert [p.name for p in result.paths] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for i, path in enumerate(result.paths):
        fields = gguf.GGUFReader(path).fields
        assert fields["split.no"].contents() == i and fields["split.count"].contents() == 3
    files = resolve_model(tmp_path)  # the folder: shard 1 is chosen
    assert files.first == result.paths[0] and len(files.shards) == 3 and files.total_bytes == result.bytes_written
    llm = Llama(tmp_path, n_ctx=128)
    try:
        assert llm.n_vocab() == 1024 and list(llm.generate("Hi", max_tokens=2, temperature=0)) is not None
    finally:
        llm.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (["no-such-preset", "-o", "x.gguf"], "unknown preset 'no-such-preset'"),
        (["tiny-llama", "-o", "x.gguf", "--type", "q3_k"], "unknown weight type 'q3_k'"),
        (["tiny-llama", "-o", "x.gguf", "--layers", "0"], "--layers 0: must be between 1 and 512"),
        (["tiny-llama", "-o", "x.gguf", "--split-max-size", "lots"], "not a positive size"),
        (["tiny-llama", "-o", "x.bin"], "must end in .gguf"),
        (["tiny-deepseek4", "-o", "x.gguf", "--experts", "1"], "--experts 1: must be between 2 (experts used per token) and 8"),
        (["tiny-llama", "-o", "x.gguf", "--experts", "4"], "--experts: tiny-llama has no routed experts"),
    ],
)
def test_bad_synth_input_is_one_line_and_writes_nothing(args: list[str], message: str, tmp_path: Path) -> None:
    args = [str(tmp_path / a) if a.endswith((".gguf", ".bin")) else a for a in args]
    result = run_pyllm("synth", *args)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and message in result.stderr
    assert list(tmp_path.iterdir()) == []


# DeepSeek-V4-Flash from its public config, written out here independently of synth.py's plans.
V4 = dict(hidden=4096, heads=64, head_dim=512, q_lora=1024, o_lora=1024, o_groups=8, experts=256, used=6,
          expert_ff=2048, vocab=129280, hc=4, idx_heads=64, idx_dim=128)


def expected_v4_layer_tensors(ratio: int, hash_layer: bool) -> int:
    attention = 9  # norm, sinks, q_a, q_a_norm, q_b, kv, kv_norm, out_a, out_b
    hyper = 6  # fn/base/scale for attention and ffn
    compressor = {0: 0, 4: 4 + 6, 128: 4}[ratio]  # kv, gate, ape, norm (+ indexer: proj, q_b, kv, gate, ape, norm)
    moe = 3 + 3 + 1 + 1 + 1  # routed experts, shared expert, router, norm, tid2eid or bias
    return attention + hyper + compressor + moe


def test_v4_flash_plan_matches_the_real_layout_per_layer() -> None:
    the_plan = synth.plan("deepseek-v4-flash")
    per_layer: dict[int, list] = {}
    for t in the_plan.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m:
            per_layer.setdefault(int(m[1]), []).append(t)
    assert len(per_layer) == 43
    ratios = synth.deepseek4_compress_ratios(43)
    assert ratios[:4] == [0, 0, 4, 128] and ratios[-1] == 4
    for i, tensors in per_layer.items():
        assert len(tensors) == expected_v4_layer_tensors(ratios[i], i < 3), i
    sizes = {t.name: synth.tensor_nbytes(t, synth.ggml_type_for(t, "ud-q8-k-xl")) for t in the_plan.tensors}
    experts = 3 * V4["experts"] * V4["expert_ff"] * V4["hidden"] * 17 // 32  # MXFP4: 17 bytes / 32 weights
    assert sum(v for k, v in sizes.items() if k.startswith("blk.10.") and "_exps" in k) == experts
    total = sum(sizes.values())
    assert 140e9 < total < 170e9, f"{total / 1e9:.1f} GB: the UD-Q8_K_XL set is ~150 GB"


@pytest.mark.build
def test_v4_flash_one_layer_is_written_with_bounded_memory_and_llama_cpp_produces_a_token(tmp_path: Path, servers) -> None:
    """4.5 GB written through the CLI (peak RSS and MB/s reported), then served on the CPU."""
    result = run_pyllm("synth", "deepseek-v4-flash", "--layers", "1", "-o", str(tmp_path / "v4.gguf"), timeout=1800)
    assert result.returncode == 0, result.stderr
    m = re.search(r"([\d.]+) MiB in 1 file, [\d.]+ s, (\d+) MB/s, peak RSS (\d+) MiB", result.stdout)
    assert m, result.stdout
    size_mib, peak_mib = float(m[1]), int(m[3])
    assert size_mib > 4000 and peak_mib < 600, result.stdout
    model = tmp_path / "v4.gguf"
    reader = gguf.GGUFReader(model)
    names = [t.name for t in reader.tensors]
    assert sum(n.startswith("blk.0.") for n in names) == expected_v4_layer_tensors(0, True)
    experts = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_exps.weight")
    assert experts.tensor_type.name == "MXFP4" and list(experts.shape) == [V4["hidden"], V4["expert_ff"], V4["experts"]]
    progress = []
    server = servers.start(model, ctx_size=256, on_progress=progress.append, ready_timeout=900)
    loading = [p for p in progress if p.phase != "ready"]
    assert loading and max(p.fraction for p in loading) > 0.9, "load progress must follow the 4.5 GB being mapped"
    reply = server_completion(server)
    assert reply["tokens_predicted"] == 1
    (tmp_path / "progress.json").write_text(json.dumps([(p.phase, p.loaded, p.seconds) for p in progress]))


def test_peak_rss_is_the_writers_own_not_its_parents(tmp_path: Path) -> None:
    """Linux keeps ru_maxrss across exec: a writer started by a big process (the test runner after hundreds of tests)
    reported the parent's resident memory as its own peak (643-659 MiB in CI for a ~250 MiB writer)."""
    ballast = b"\x01" * (700 << 20)  # resident in this process when the writer is forked
    result = run_pyllm("synth", "tiny-deepseek4", "-o", str(tmp_path / "t.gguf"), timeout=300)
    assert result.returncode == 0 and len(ballast) == 700 << 20, result.stderr
    peak_mib = int(re.search(r"peak RSS (\d+) MiB", result.stdout)[1])
    assert peak_mib < 400, result.stdout


def server_completion(server) -> dict:
    import httpx

    return httpx.post(server.base_url + "/completion", json={"prompt": "Hello", "n_predict": 1, "temperature": 0}, timeout=600).json()


LONG_RUNS = ["a" * 50_000, " " * 50_000, "!" * 50_000, "é" * 50_000, "一" * 30_000, "\n" * 50_000]


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_a_50000_character_run_gets_a_clean_400_and_the_server_lives_on(preset: str, tiny_models: dict[str, Path], servers) -> None:
    """The DeepSeek-V3 pre-tokenizer of the synthetic vocabulary (and of real DeepSeek GGUFs) ran through
    std::regex, which recursed once per character: a long run of one character class overflowed the
    stack and killed llama-server (vendor/patches/0003). Now each such prompt is tokenized and refused
    as too long for the context, on both endpoints, and the server keeps answering."""
    import httpx
    from openai import BadRequestError, OpenAI

    server = servers.start(tiny_models[preset], ctx_size=4096, parallel=1)
    with httpx.Client(base_url=server.base_url, timeout=300) as http:
        for text in LONG_RUNS:
            reply = http.post("/completion", json={"prompt": text, "n_predict": 1})
            assert reply.status_code == 400, (repr(text[:3]), reply.status_code, reply.text[:300])
            message = reply.json()["error"]["message"]  # 0035: the limit named, the trained context or a smaller slot
            assert message.startswith("this request's prompt is ") and "but a slot holds at most 4,096 tokens" in message, message
            assert "shorten the prompt" in message and ("trained context" in message or "--ctx-size" in message), message
        api = OpenAI(base_url=server.openai_base_url, api_key="none", max_retries=0, timeout=300)
        with pytest.raises(BadRequestError, match="this request's prompt is .* tokens, but a slot holds at most 4,096"):
            api.chat.completions.create(model=preset, messages=[{"role": "user", "content": "a" * 50_000}], max_tokens=1)
        assert server.proc.poll() is None and http.get("/health").status_code == 200
        after = http.post("/completion", json={"prompt": "Hello", "n_predict": 2, "temperature": 0}).json()
        assert after["tokens_predicted"] == 2


def _values(path: Path) -> dict:
    from gguf.quants import dequantize

    return {t.name: dequantize(t.data, t.tensor_type).astype("float64").ravel() for t in gguf.GGUFReader(path).tensors
            if t.tensor_type.name != "I32"}


@pytest.mark.parametrize("weight_type, tolerance", [("f32", 0.05), ("q8_0", 0.1), ("ud-q8-k-xl", 0.6)])
def test_weights_follow_the_one_rule_in_every_type(weight_type: str, tolerance: float, tmp_path: Path) -> None:
    """synth.py's docstring rule, read back with gguf's own dequantizer: readers 1/sqrt(fan_in), residual writers
    also 1/sqrt(2 * depth), routed experts' down sqrt(k)/expert_weights_scale, gains near 1, small router biases,
    hyper-connections at their identity point (pre 1/hc, post 1, comb diagonal 0.9)."""
    import math

    import numpy as np

    h = synth.PRESETS["tiny-deepseek4"].hparams
    v = _values(synth.synthesize("tiny-deepseek4", tmp_path / "m.gguf", weight_type=weight_type, seed=5).first)
    depth, n_embd = h["n_layers"], h["n_embd"]

    def close(name: str, want: float, tol: float = tolerance) -> None:
        got = float(np.std(v[name]))
        assert abs(got / want - 1) < tol, (name, got, want)

    close("token_embd.weight", 1.0)
    close("blk.2.attn_q_b.weight", 1 / math.sqrt(h["q_lora"]))
    close("blk.2.ffn_gate_inp.weight", 1 / math.sqrt(n_embd))
    close("blk.2.attn_output_b.weight", 1 / math.sqrt(h["o_groups"] * h["o_lora"] * 2 * depth))
    close("blk.2.ffn_down_shexp.weight", 1 / math.sqrt(h["n_ff_exp"] * 2 * depth))
    close("blk.2.ffn_down_exps.weight", math.sqrt(h["n_expert_used"]) / h["expert_weights_scale"] / math.sqrt(h["n_ff_exp"] * 2 * depth))
    close("blk.2.hc_attn_fn.weight", 1 / math.sqrt(h["hc_mult"] * n_embd), 0.05)  # always F32
    assert abs(v["blk.2.attn_norm.weight"].mean() - 1) < 0.02 and v["blk.2.attn_norm.weight"].std() < 0.15
    assert np.abs(v["blk.2.exp_probs_b.bias"]).max() < 0.05
    hc = h["hc_mult"]
    base = v["blk.2.hc_attn_base.weight"]
    sigmoid = 1 / (1 + np.exp(-base))
    assert abs(sigmoid[:hc].mean() - 1 / hc) < 0.05 and abs(2 * sigmoid[hc:2 * hc].mean() - 1) < 0.1
    comb = np.exp(base[2 * hc:].reshape(hc, hc))
    assert (np.diag(comb / comb.sum(axis=1, keepdims=True)) > 0.8).all()
    assert abs(v["blk.2.hc_ffn_scale.weight"].mean() - 0.1) < 0.02


def test_cut_model_keeps_the_full_models_layers_and_same_layout_presets_differ(tmp_path: Path) -> None:
    """Writer scales come from the preset's full depth: --layers 2 holds the same first layers as the
    full model. GLM-DSA and DeepSeek-V3.2 share a layout but draw independent weights."""
    full = _values(synth.synthesize("tiny-deepseek4", tmp_path / "full.gguf", seed=3).first)
    cut = _values(synth.synthesize("tiny-deepseek4", tmp_path / "cut.gguf", layers=2, seed=3).first)
    assert any(n.startswith("blk.1.") for n in cut) and not any(n.startswith("blk.2.") for n in cut)
    for name in cut:
        assert (cut[name] == full[name]).all(), name
    glm = _values(synth.synthesize("tiny-glm-dsa", tmp_path / "glm.gguf", seed=3).first)
    ds32 = _values(synth.synthesize("tiny-deepseek32", tmp_path / "ds32.gguf", seed=3).first)
    assert glm.keys() == ds32.keys() and not (glm["blk.1.ffn_gate_inp.weight"] == ds32["blk.1.ffn_gate_inp.weight"]).any()


def _activation_probe():
    from lab.runs import activation_rms

    return activation_rms


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_activations_stay_in_the_range_of_a_trained_model(preset: str, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """The real llama.cpp on the CPU, read through an eval callback (lab/runs/activation_rms.py): a residual stream
    near unit RMS that each layer changes by a fraction, K rows at unit RMS, logits spread like a trained
    model's, routers that are not tied."""
    import numpy as np

    probe = _activation_probe().probe
    tokens = [int(t) for t in np.random.default_rng(0).integers(20, 1000, 48)]
    used = synth.PRESETS[preset].hparams.get("n_expert_used", 2)
    result = probe(tiny_models[preset], tokens, used, True, tmp_path)
    layers = result["layers"]
    assert len(layers) == synth.PRESETS[preset].layers
    recurrent = synth.PRESETS[preset].family == "mamba"  # a state-space layer: no K rows, no router
    for row in layers:
        assert 0.5 < row["resid"] < 2 and row["change"] < 0.6, row  # each layer moves the stream by a fraction
        assert recurrent or 0.7 < row["k"] < 1.4, row
    assert 0.5 < result["logits_std"] < 2
    routed = [row for row in layers if "margin_median" in row]
    assert (preset in ("tiny-llama", "tiny-mamba")) == (not routed)
    for row in routed:
        assert 0.5 < row["router_std"] < 2 and row["margin_median"] > 0.02, row
