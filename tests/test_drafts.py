"""Speculative decoding: synthetic drafts, detection, refusals, and greedy tokens equal with and without a draft.

The drafts have random weights, so llama-server accepts almost none of their tokens:
these tests show the draft is loaded and used (``draft_n`` > 0) and that the target's
verification keeps the output exact, not a speed-up (python -m lab.runs.gpu_check --only drafts, at commit
cf107d3, measured that on the GPU).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import gguf
import pytest

from conftest import run_pyllm
from pyllm_a100.errors import EX_CONFIG  # pyllm serve's exit status for configuration errors

SEED = 42


@pytest.fixture(scope="session")
def draft_models(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The draft presets written beside their targets (seed 42, as the targets)."""
    from pyllm_a100.synth import synthesize

    root = tmp_path_factory.mktemp("drafts")
    names = ("tiny-deepseek4-dspark", "tiny-deepseek4-mtp", "tiny-glm-dsa-mtp", "tiny-deepseek32-mtp")
    return {name: synthesize(name, root / f"{name}.gguf", seed=SEED).first for name in names}


def _tensor_names(path: Path) -> set[str]:
    return {t.name for t in gguf.GGUFReader(path).tensors}


def test_dspark_draft_has_the_layout_the_pin_loads(draft_models: dict[str, Path], tiny_models: dict[str, Path]) -> None:
    reader = gguf.GGUFReader(draft_models["tiny-deepseek4-dspark"])
    field = reader.fields["general.architecture"]
    assert bytes(field.parts[field.data[0]]).decode() == "dflash"
    names = _tensor_names(draft_models["tiny-deepseek4-dspark"])
    assert {"markov_w1.weight", "markov_w2.weight", "conf_proj.weight", "fc.weight", "enc.output_norm.weight"} <= names
    assert "token_embd.weight" not in names and "output.weight" not in names  # shared with the target
    layers = reader.fields["dflash.target_layers"]
    assert [int(layers.parts[i][0]) for i in layers.data] == [2, 3, 4]  # within the 4-layer target
    target = gguf.GGUFReader(tiny_models["tiny-deepseek4"])
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == len(target.fields["tokenizer.ggml.tokens"].data)


def test_mtp_draft_shares_the_targets_embedding_and_head_bytes(draft_models: dict[str, Path], tiny_models: dict[str, Path]) -> None:
    """Same seed, same names, same architecture: the sidecar's shared tensors are the target's, byte for byte."""
    for target, draft in (("tiny-deepseek4", "tiny-deepseek4-mtp"), ("tiny-glm-dsa", "tiny-glm-dsa-mtp")):
        t = {x.name: x for x in gguf.GGUFReader(tiny_models[target]).tensors}
        d = {x.name: x for x in gguf.GGUFReader(draft_models[draft]).tensors}
        for name in ("token_embd.weight", "output.weight", "output_norm.weight"):
            assert bytes(t[name].data.tobytes()) == bytes(d[name].data.tobytes()), (draft, name)
        n = len([k for k in t if k.endswith(".attn_norm.weight")])
        assert f"blk.{n}.nextn.eh_proj.weight" in d and "blk.0.attn_norm.weight" not in d


@pytest.mark.parametrize("draft, expected", [
    ("tiny-deepseek4-dspark", "draft-dspark"), ("tiny-deepseek4-mtp", "draft-mtp"), ("tiny-glm-dsa-mtp", "draft-mtp"),
])
def test_detect_reads_the_kind_from_the_gguf(draft_models: dict[str, Path], draft: str, expected: str) -> None:
    from pyllm_a100.models.drafts import detect
    from pyllm_a100.models.gguf_files import resolve_model

    assert detect(resolve_model(draft_models[draft])) == expected


def test_a_plain_model_is_a_simple_draft(tiny_models: dict[str, Path]) -> None:
    from pyllm_a100.models.drafts import detect
    from pyllm_a100.models.gguf_files import resolve_model

    assert detect(resolve_model(tiny_models["tiny-llama"])) == "draft-simple"


def test_done_when_serve_with_dspark_draft_gives_the_plain_servers_tokens(tiny_models: dict[str, Path],
                                                                          draft_models: dict[str, Path]) -> None:
    """`pyllm serve tiny-deepseek4.gguf --draft tiny-deepseek4-dspark.gguf` == the plain server at temperature 0."""
    from pyllm_a100 import Server
    from pyllm_a100.bench.draft_exactness import greedy

    model, draft = tiny_models["tiny-deepseek4"], draft_models["tiny-deepseek4-dspark"]
    with Server(model, port=0, ready_timeout=300) as plain:
        expected, _ = greedy(plain.base_url, "The quick brown fox", 24)
    started = run_pyllm("serve", str(model), "--draft", str(draft), "--draft-max", "7", "--port", "0", "--detach",
                        "--name", "spec", timeout=300)
    assert started.returncode == 0, started.stderr
    try:
        assert "draft-dspark" in started.stderr
        ps = run_pyllm("ps", "--json", check=True)
        (entry,) = [e for e in json.loads(ps.stdout) if e["name"] == "spec"]
        assert entry["draft"]["spec_type"] == "draft-dspark" and entry["draft"]["path"] == str(draft.resolve())
        assert "draft: " in run_pyllm("ps", check=True).stdout
        tokens, timings = greedy(entry["url"], "The quick brown fox", 24)
    finally:
        run_pyllm("stop", "spec", check=True)
    assert tokens == expected
    assert timings["draft_n"] > 0  # llama-server really drafted (and verified) tokens


def test_serve_drafts_two_tokens_a_step_unless_told(tiny_models: dict[str, Path], draft_models: dict[str, Path]) -> None:
    """DSpark/MTP without --draft-max draft 2 a step (the measured best on a MoE verify, not the block of 7); a given
    --draft-max wins; a small-model draft keeps llama-server's own default. Served: the drafted tokens per step stay
    within 2 (the tiny pair's draft is random, so llama-server drafts the full length every step)."""
    from pyllm_a100 import Server
    from pyllm_a100.bench.draft_exactness import greedy
    from pyllm_a100.models.drafts import DEFAULT_MAX
    from pyllm_a100.serve.resolve import resolve
    from pyllm_a100.serve.options import ServeOptions

    model = tiny_models["tiny-deepseek4"]
    for draft in ("tiny-deepseek4-dspark", "tiny-deepseek4-mtp"):
        assert resolve(ServeOptions(model, draft=str(draft_models[draft]), port=0)).draft.n_max == DEFAULT_MAX == 2
    assert resolve(ServeOptions(model, draft=str(draft_models["tiny-deepseek4-dspark"]), draft_max=7, port=0)).draft.n_max == 7
    simple = resolve(ServeOptions(model, draft=str(tiny_models["tiny-llama"]), port=0))
    assert simple.draft.spec_type == "draft-simple" and simple.draft.n_max is None
    assert "--spec-draft-n-max" not in simple.draft.argv()
    with Server(model, draft=str(draft_models["tiny-deepseek4-dspark"]), port=0, ready_timeout=300) as server:
        assert server.config.draft.argv()[-2:] == ["--spec-draft-n-max", "2"]
        _, timings = greedy(server.base_url, "The quick brown fox", 24)
    assert timings["draft_n"] > 0
    steps = 24 - timings["draft_n_accepted"]  # each step gives one token plus those it accepted
    assert timings["draft_n"] <= 2 * steps, timings


@pytest.mark.parametrize("target, draft", [
    ("tiny-deepseek4", "tiny-deepseek4-mtp"), ("tiny-glm-dsa", "tiny-glm-dsa-mtp"), ("tiny-deepseek32", "tiny-deepseek32-mtp"),
])
def test_mtp_draft_keeps_greedy_tokens(tiny_models: dict[str, Path], draft_models: dict[str, Path], target: str, draft: str) -> None:
    from pyllm_a100.bench.draft_exactness import compare

    result = compare(tiny_models[target], draft_models[draft], n_predict=16, ready_timeout=300)
    assert result["spec_type"] == "draft-mtp"
    assert result["equal"], f"tokens part at {result['first_difference']}: {result['tokens_plain']} vs {result['tokens_draft']}"
    assert result["draft_n"] > 0


def test_auto_uses_the_models_own_mtp_block(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """A GLM-5 GGUF that keeps its NextN block: --draft auto runs draft-mtp on the model's own weights (no -md)."""
    from pyllm_a100 import Server
    from pyllm_a100.bench.draft_exactness import PROMPT, compare, greedy
    from pyllm_a100.synth import synthesize

    model = synthesize("tiny-glm-dsa-nextn", tmp_path / "glm" / "model.gguf", seed=SEED).first
    result = compare(model, "auto", n_predict=16, ready_timeout=300)
    assert result["spec_type"] == "draft-mtp" and result["equal"] and result["draft_n"] > 0
    with Server(tiny_models["tiny-glm-dsa"], port=0, ready_timeout=300) as trunk:  # same seed: the same trunk weights
        assert greedy(trunk.base_url, PROMPT, 16)[0] == result["tokens_plain"]


def test_concurrent_requests_with_a_dspark_draft_all_get_the_plain_tokens(servers, tiny_models: dict[str, Path],
                                                                         draft_models: dict[str, Path]) -> None:
    """Four clients at once on two slots: each slot drafts for its own sequence; every answer is the plain one."""
    from concurrent.futures import ThreadPoolExecutor

    from pyllm_a100.bench.draft_exactness import greedy

    model = tiny_models["tiny-deepseek4"]
    prompts = ["The quick brown fox", "Hello, world!", "def add(a, b):", "你好，世界"]
    plain = servers.start(model, parallel=2)
    expected = [greedy(plain.base_url, p, 16)[0] for p in prompts]
    plain.stop()
    drafted = servers.start(model, parallel=2, draft=str(draft_models["tiny-deepseek4-dspark"]), draft_max=7)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: greedy(drafted.base_url, p, 16), prompts))
    assert [tokens for tokens, _ in answers] == expected
    assert all(timings["draft_n"] > 0 for _, timings in answers)


def test_generate_refuses_a_dspark_draft_and_runs_prompt_lookup(tiny_models: dict[str, Path], draft_models: dict[str, Path]) -> None:
    refused = run_pyllm("generate", str(tiny_models["tiny-deepseek4"]), "Hello", "--draft", str(draft_models["tiny-deepseek4-dspark"]))
    assert refused.returncode == 1 and "pyllm serve MODEL --draft" in refused.stderr and "Traceback" not in refused.stderr
    plain = run_pyllm("generate", str(tiny_models["tiny-llama"]), "the cat the cat the", "--temperature", "0", "--max-tokens", "12",
                      check=True)
    drafted = run_pyllm("generate", str(tiny_models["tiny-llama"]), "the cat the cat the", "--temperature", "0", "--max-tokens", "12",
                        "--draft", "prompt-lookup", "--draft-max", "3", check=True)
    assert drafted.stdout == plain.stdout


def test_relative_draft_path_survives_detach(tiny_models: dict[str, Path], draft_models: dict[str, Path], tmp_path: Path) -> None:
    """The detached supervisor runs from /: a relative --draft is made absolute before it starts."""
    import shutil
    import subprocess

    from conftest import PYLLM

    shutil.copy(draft_models["tiny-deepseek4-dspark"], tmp_path / "my draft.gguf")
    result = subprocess.run([str(PYLLM), "serve", str(tiny_models["tiny-deepseek4"]), "--draft", "my draft.gguf", "--port", "0",
                             "--detach", "--name", "rel"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    try:
        (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
        assert entry["status"] == "ready" and entry["draft"]["path"] == str(tmp_path / "my draft.gguf")
    finally:
        run_pyllm("stop", "rel", check=True)


@pytest.mark.parametrize("case", ["vocab", "missing", "not-gguf", "empty", "arch", "depth", "auto-none", "max-without-draft",
                                  "self", "max-range"])
def test_bad_draft_is_refused_in_one_line_before_start(case: str, tiny_models: dict[str, Path], draft_models: dict[str, Path],
                                                       tmp_path: Path, pyllm_home: Path, request: pytest.FixtureRequest) -> None:
    from pyllm_a100.synth import synthesize

    model = tiny_models["tiny-deepseek4"]
    args = {
        "vocab": [],  # SmolLM2's real 49152-token vocabulary beside the synthetic 1024-token one
        "missing": ["--draft", str(tmp_path / "nope.gguf")],
        "not-gguf": ["--draft", str(tmp_path / "text.gguf")],
        "empty": ["--draft", ""],
        "arch": ["--draft", str(draft_models["tiny-glm-dsa-mtp"])],
        "depth": ["--draft", "DEEP"],
        "auto-none": ["--draft", "auto"],
        "max-without-draft": ["--draft-max", "7"],
        "self": ["--draft", str(model)],  # the model itself holds no MTP block
        "max-range": ["--draft", str(draft_models["tiny-deepseek4-dspark"]), "--draft-max", "0"],
    }[case]
    (tmp_path / "text.gguf").write_text("not a model\n")
    if case == "vocab":
        args = ["--draft", str(request.getfixturevalue("smollm2"))]
    if case == "depth":  # a DSpark draft written for an 8-layer target, served beside a 4-layer one
        args = ["--draft", str(synthesize("tiny-deepseek4-dspark", tmp_path / "deep.gguf", layers=8, seed=SEED).first)]
    if case == "auto-none":  # a model alone in its folder
        alone = tmp_path / "alone" / "m.gguf"
        alone.parent.mkdir()
        os.link(model, alone)
        model = alone
    result = run_pyllm("serve", str(model), "--port", "0", *args, timeout=120)
    assert result.returncode == EX_CONFIG
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "draft" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not list((pyllm_home / "servers").glob("*")) if (pyllm_home / "servers").exists() else True


def test_a_small_model_of_the_same_vocabulary_drafts_exactly(tiny_models: dict[str, Path]) -> None:
    """tiny-llama shares tiny-deepseek4's synthetic tokenizer: a plain draft model (draft-simple)."""
    from pyllm_a100.bench.draft_exactness import compare

    result = compare(tiny_models["tiny-deepseek4"], tiny_models["tiny-llama"], n_predict=16, draft_max=4, ready_timeout=300)
    assert result["spec_type"] == "draft-simple"
    assert result["equal"], f"tokens part at {result['first_difference']}"
    assert result["draft_n"] > 0


def test_a_draft_on_a_model_that_restores_checkpoints_keeps_greedy_tokens(tiny_models: dict[str, Path]) -> None:
    """A recurrent model cannot drop rejected tokens in place: llama-server restores a checkpoint and the sampler's copy
    on every partly rejected draft (the path patch 0040 keeps the copy for). A random tiny-llama drafting for tiny-mamba
    is rejected at almost every step, so every step goes through it; the tokens stay those without a draft."""
    from pyllm_a100.bench.draft_exactness import compare

    result = compare(tiny_models["tiny-mamba"], tiny_models["tiny-llama"], n_predict=32, draft_max=4, ready_timeout=300)
    assert result["spec_type"] == "draft-simple" and result["draft_n"] > 0
    assert result["draft_n_accepted"] < result["draft_n"]  # rejections: restores happened
    assert result["equal"], f"tokens part at {result['first_difference']}"


def test_auto_finds_the_sidecar_beside_the_model(tiny_models: dict[str, Path], draft_models: dict[str, Path], tmp_path: Path) -> None:
    from pyllm_a100.models.drafts import resolve
    from pyllm_a100.models.gguf_files import resolve_model

    os.link(tiny_models["tiny-deepseek4"], tmp_path / "model.gguf")  # links: resolve() keeps this folder
    os.link(draft_models["tiny-deepseek4-dspark"], tmp_path / "dspark-model.gguf")
    draft = resolve(resolve_model(tmp_path / "model.gguf"), "auto", 5)
    assert draft.spec_type == "draft-dspark"
    assert draft.argv() == ["--spec-draft-model", str(tmp_path / "dspark-model.gguf"),
                            "--spec-type", "draft-dspark", "--spec-draft-n-max", "5"]
    os.link(draft_models["tiny-deepseek4-mtp"], tmp_path / "mtp-model.gguf")
    with pytest.raises(ValueError, match="2 drafts beside"):
        resolve(resolve_model(tmp_path / "model.gguf"), "auto")


def test_fetch_draft_brings_the_sidecar_and_serve_auto_uses_it(tiny_models: dict[str, Path], draft_models: dict[str, Path],
                                                               tmp_path: Path, pyllm_home: Path) -> None:
    """Through the real huggingface_hub against the loopback hub: --draft adds the dspark-* file, the manifest pairs them."""
    from hub import FakeHub

    repo = "unsloth/Tiny-DSV4-GGUF"
    hub = FakeHub()
    try:
        hub.add_repo(repo, {"F16/Tiny-DSV4-F16.gguf": tiny_models["tiny-deepseek4"].read_bytes(),
                            "F16/dspark-Tiny-DSV4-F16.gguf": draft_models["tiny-deepseek4-dspark"].read_bytes(),
                            "README.md": b"# tiny\n"})
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1",
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", PYLLM_HOME=str(pyllm_home))
        root = pyllm_home / "models" / "hf" / "unsloth--Tiny-DSV4-GGUF"
        plain = run_pyllm("fetch", repo, "--include", "F16/Tiny-DSV4-F16.gguf", env=env, timeout=300)
        assert plain.returncode == 0, plain.stderr
        assert not (root / "F16" / "dspark-Tiny-DSV4-F16.gguf").exists()
        refused = run_pyllm("serve", repo, "--draft", "auto", "--port", "0", env=env, timeout=120)
        assert refused.returncode == EX_CONFIG and "fetch" in refused.stderr.strip().splitlines()[-1] and "--draft" in refused.stderr
        result = run_pyllm("fetch", repo, "--include", "F16/Tiny-DSV4-F16.gguf", "--draft", env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "--draft auto" in result.stdout
    finally:
        hub.close()
    manifest = json.loads((root / ".pyllm-manifest.json").read_text())
    assert manifest["drafts"] == [{"model": "F16/Tiny-DSV4-F16.gguf", "draft": "F16/dspark-Tiny-DSV4-F16.gguf"}]
    listed = json.loads(run_pyllm("models", "--json", env=env, check=True).stdout)
    assert [r["path"] for r in listed] == [str(root / "F16" / "Tiny-DSV4-F16.gguf")]  # the sidecar is not a model of its own
    started = run_pyllm("serve", repo, "--draft", "auto", "--port", "0", "--detach", "--name", "auto", env=env, timeout=300)
    assert started.returncode == 0, started.stderr
    try:
        (entry,) = json.loads(run_pyllm("ps", "--json", env=env, check=True).stdout)
        assert entry["draft"] == {"path": str(root / "F16" / "dspark-Tiny-DSV4-F16.gguf"), "spec_type": "draft-dspark", "n_max": 2}
        from pyllm_a100.bench.draft_exactness import greedy

        _, timings = greedy(entry["url"], "Hello", 8)
        assert timings["draft_n"] > 0
    finally:
        run_pyllm("stop", "auto", env=env, check=True)


def _greedy_in_process(model: Path, n: int = 16, **options) -> list[int]:
    from pyllm_a100 import Llama

    llm = Llama(model, n_ctx=512, **options)
    try:
        tokens = llm.tokenize(b"The quick brown fox jumps over the quick brown fox jumps over the", add_bos=True)
        out = []
        for token in llm.generate(tokens, temp=0.0, top_k=1):
            out.append(int(token))
            if len(out) >= n:
                break
        return out
    finally:
        llm.close()


@pytest.mark.parametrize("draft", ["small-model", "prompt-lookup"])
def test_in_process_draft_keeps_greedy_tokens(tiny_models: dict[str, Path], draft: str, tmp_path: Path) -> None:
    """llama-cpp-python's draft_model path: a small model of the same vocabulary (tiny-llama of another seed), or prompt lookup."""
    from pyllm_a100.synth import synthesize

    model = tiny_models["tiny-llama"]
    expected = _greedy_in_process(model)
    spec = str(synthesize("tiny-llama", tmp_path / "draft.gguf", seed=7).first) if draft == "small-model" else draft
    assert _greedy_in_process(model, draft=spec, draft_max=4) == expected


def test_in_process_draft_is_refused_for_a_cache_that_cannot_rewind(tiny_models: dict[str, Path]) -> None:
    """DeepSeek-V4's cache cannot drop the rejected tail in place, which llama-cpp-python's speculative loop needs."""
    from pyllm_a100 import Llama
    from pyllm_a100.models.drafts import InProcessUnsupported

    with pytest.raises(InProcessUnsupported, match="cannot drop rejected draft tokens"):
        Llama(tiny_models["tiny-deepseek4"], n_ctx=512, draft="prompt-lookup")


@pytest.mark.parametrize("draft_max", [0, 65, -1, True, 2.5])
def test_in_process_draft_length_out_of_range_is_refused_in_one_line(tiny_models: dict[str, Path], draft_max: object) -> None:
    from pyllm_a100 import Llama
    from pyllm_a100.models.drafts import DraftError

    with pytest.raises(DraftError, match=r"^draft_max=.*: give the number of tokens drafted per step, 1 to 64") as caught:
        Llama(tiny_models["tiny-llama"], n_ctx=256, draft="prompt-lookup", draft_max=draft_max)
    assert "\n" not in str(caught.value)


def test_in_process_refuses_dspark_and_mtp_drafts_in_one_line(tiny_models: dict[str, Path], draft_models: dict[str, Path]) -> None:
    from pyllm_a100 import Llama
    from pyllm_a100.models.drafts import InProcessUnsupported

    for name in ("tiny-deepseek4-dspark", "tiny-deepseek4-mtp"):
        with pytest.raises(InProcessUnsupported, match="pyllm serve MODEL --draft") as caught:
            Llama(tiny_models["tiny-deepseek4"], draft=str(draft_models[name]))
        assert "\n" not in str(caught.value)


def test_a_draft_given_as_the_model_is_refused_in_one_line(draft_models: dict[str, Path]) -> None:
    for name in ("tiny-deepseek4-dspark", "tiny-glm-dsa-mtp"):
        for command in (["serve", str(draft_models[name]), "--port", "0"], ["generate", str(draft_models[name]), "hi"]):
            result = run_pyllm(*command, timeout=60)
            assert result.returncode == (EX_CONFIG if command[0] == "serve" else 1) and result.stderr.count("\n") == 1, result.stderr
            assert "is a speculative-decoding draft" in result.stderr and f"--draft {draft_models[name]}" in result.stderr


def test_a_folder_with_a_model_and_its_sidecar_serves_the_model(draft_models: dict[str, Path], tiny_models: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """What `pyllm fetch --local-dir D --draft` leaves: D/model.gguf and D/dspark-model.gguf; `serve D` means the model."""
    from pyllm_a100.models.gguf_files import locate

    (tmp_path / "model.gguf").symlink_to(tiny_models["tiny-deepseek4"])
    (tmp_path / "dspark-model.gguf").symlink_to(draft_models["tiny-deepseek4-dspark"])
    assert locate(tmp_path) == tmp_path / "model.gguf"
    only_draft = tmp_path / "alone"
    only_draft.mkdir()
    (only_draft / "dspark-model.gguf").symlink_to(draft_models["tiny-deepseek4-dspark"])
    result = run_pyllm("serve", str(only_draft), "--port", "0", timeout=60)
    assert result.returncode == EX_CONFIG and "is a speculative-decoding draft" in result.stderr, result.stderr


def test_bench_speculate_measures_the_draft_and_picks_the_best_length(tiny_models: dict[str, Path],
                                                                      draft_models: dict[str, Path]) -> None:
    """issue 42 item 3: the DSpark pair end to end -- verify costs, the draft's own cost per step, the greedy tokens
    unchanged, and per acceptance the draft length whose projected tokens/s is the highest (0: no draft)."""
    from pyllm_a100.bench.speculate import acceptance_for
    from pyllm_a100.bench.verify import expected_tokens

    result = run_pyllm("bench", "speculate", str(tiny_models["tiny-deepseek4"]), "--draft",
                       str(draft_models["tiny-deepseek4-dspark"]), "--draft-max", "3", "--depth", "32",
                       "--prompt-tokens", "16", "--gen-tokens", "24", "--repeat", "2", "--acceptance", "0.9", "--json")
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)
    assert spec["spec_type"] == "draft-dspark" and spec["draft"]["fixed_ms"] >= 0 and spec["draft"]["per_token_ms"] >= 0
    assert [r["k"] for r in spec["verify"]["rows"]] == [1, 2, 3, 4]
    # served at two lengths (about half of --draft-max, then --draft-max): the cost per step and per drafted token
    assert [r["draft_args"][r["draft_args"].index("--spec-draft-n-max") + 1] for r in spec["runs"]] == ["2", "3"]
    assert spec["run"] == spec["runs"][-1] and [m["drafted"] for m in spec["draft"]["measured"]] == sorted(
        r["drafted"] / r["steps"] for r in spec["runs"])
    assert all(r["same_tokens"] and r["drafted"] > 0 for r in spec["runs"])
    sources = [c["source"] for c in spec["choices"]]
    assert sources == ["this run's prompts (random tokens)", "accepted length 2.5 at 7 drafted",
                       "accepted length 2.9 at 7 drafted", "acceptance 0.9 per token"]
    verify = {r["k"]: r["ms"] for r in spec["verify"]["rows"]}
    for c in spec["choices"]:
        assert [p["k"] for p in c["curve"]] == [0, 1, 2, 3]
        for p in c["curve"][1:]:  # E(a, k) / (verify(k + 1) + the draft's cost of k tokens)
            own = spec["draft"]["fixed_ms"] + p["k"] * spec["draft"]["per_token_ms"]
            want = expected_tokens(c["acceptance"], p["k"]) / (verify[p["k"] + 1] + own) * 1000
            assert p["tokens_per_s"] == pytest.approx(want)
        best = max(c["curve"], key=lambda p: p["tokens_per_s"])
        assert c["best_k"] == best["k"] and c["tokens_per_s"] == best["tokens_per_s"]
        assert c["speedup"] == pytest.approx(c["tokens_per_s"] / spec["plain_tps"])
    assert spec["choices"][0]["acceptance"] == pytest.approx(spec["run"]["accepted"] / spec["run"]["drafted"])
    # each given acceptance whose best k drafts was served there with that acceptance made synthetic; this run's own
    # acceptance was measured as it is, and a plain-decoding choice has nothing to serve
    for c in spec["choices"]:
        if c["best_k"] and c["source"] != sources[0]:
            m = c["measured"]
            assert m["k"] == c["best_k"] and m["synth_len"] == pytest.approx(expected_tokens(c["acceptance"], c["best_k"]), abs=1e-5)
            assert m["tokens_per_s"] > 0 and m["speedup"] == pytest.approx(m["tokens_per_s"] / m["plain_tokens_per_s"])
        else:
            assert c["measured"] is None
    assert expected_tokens(spec["choices"][1]["acceptance"], 7) == pytest.approx(2.5)
    assert spec["choices"][2]["acceptance"] == pytest.approx(acceptance_for(2.9))
    # the weights each verify width must read, from the model's own header: 1 at k = 1, growing with the experts reached
    from pyllm_a100.models.gguf_files import resolve_model
    from pyllm_a100.planning.roofline import weights_per_token

    weights = weights_per_token(resolve_model(tiny_models["tiny-deepseek4"]))
    floor = {r["k"]: r["weights"] for r in spec["verify"]["rows"]}
    assert floor[1] == pytest.approx(1.0) and floor[4] > floor[2] > 1.0
    assert all(w == pytest.approx(weights.read_ratio(k)) for k, w in floor.items())
    # and, per acceptance, the most a draft of up to 3 tokens could give if each verify cost only those weights
    for c in spec["choices"]:
        gains = {d: expected_tokens(c["acceptance"], d) / floor[d + 1] for d in (1, 2, 3)}
        d = max(gains, key=gains.get)
        assert (c["bound_k"], c["bound_speedup"]) == ((d, pytest.approx(gains[d])) if gains[d] > 1 else (0, 1.0))


def test_a_choice_is_measured_at_its_acceptance_made_synthetic(tiny_models: dict[str, Path],
                                                               draft_models: dict[str, Path]) -> None:
    """The projection's best k served with llama-server's synthetic acceptance (--spec-synth-len E(a, k)): the random
    DSpark draft, which the target accepts nowhere on its own, yields about E(a, k) tokens a step there."""
    from pyllm_a100.bench.speculate import Choice, measure_choices, synthetic_args
    from pyllm_a100.bench.verify import expected_tokens
    from pyllm_a100.models.drafts import resolve
    from pyllm_a100.models.gguf_files import resolve_model

    model = str(tiny_models["tiny-deepseek4"])
    draft = resolve(resolve_model(model), str(draft_models["tiny-deepseek4-dspark"]), 3)
    choice = lambda a, k: Choice(source=f"a={a}", acceptance=a, best_k=k, tokens_per_step=expected_tokens(a, k),
                                 tokens_per_s=0.0, speedup=0.0, curve=[])
    high, low, plain = choice(0.9, 2), choice(0.3, 3), choice(0.9, 0)
    assert synthetic_args(0.9, 2) == ["--spec-synth-len", f"{1 + 0.9 + 0.81:.6f}"]
    measure_choices(model, draft, [high, low, plain], prompt_tokens=16, gen_tokens=32, requests=2, tensor_split=None)
    assert plain.measured is None
    for c, (lo, hi) in ((high, (2.2, 3.0)), (low, (1.1, 1.8))):  # E = 2.71 and 1.417 (the request's seed is fixed)
        m = c.measured
        assert m["k"] == c.best_k and m["synth_len"] == pytest.approx(expected_tokens(c.acceptance, c.best_k), abs=1e-5)
        assert lo < m["tokens_per_step"] < hi, m
        assert m["tokens_per_s"] > 0 and m["plain_tokens_per_s"] > 0
    # a run the server refuses (a length past the draft's block of 8, which bench speculate itself never asks for)
    # leaves the projection unchecked, with the server's reason, instead of losing the whole benchmark
    beyond = choice(0.99, 12)
    measure_choices(model, draft, [beyond], prompt_tokens=8, gen_tokens=8, requests=1, tensor_split=None)
    assert "synthetic acceptance length must be finite and within [1, 9]" in beyond.measured["error"]


def test_a_draft_cost_is_the_line_through_two_lengths() -> None:
    """Two draft lengths give a cost per step and per drafted token; noise that makes the longer draft cheaper puts it
    all per step; one length (or two that drafted alike) falls back to the draft's kind."""
    from pyllm_a100.bench.speculate import draft_cost, draft_lengths

    cost = draft_cost([(7.0, 4.4), (2.9, 2.5)], per_step=True)  # the sixteenth GPU run's DSpark, natively
    assert cost.per_token_ms == pytest.approx(1.9 / 4.1) and cost.fixed_ms == pytest.approx(4.4 - 7 * 1.9 / 4.1)
    assert cost.ms(7) == pytest.approx(4.4) and cost.ms(3) == pytest.approx(2.5 + 0.1 * 1.9 / 4.1)
    assert [m["drafted"] for m in cost.measured] == [2.9, 7.0]
    flat = draft_cost([(3.0, 2.0), (7.0, 1.8)], per_step=False)  # the longer draft measured cheaper: noise
    assert flat.per_token_ms == 0.0 and flat.fixed_ms == pytest.approx(1.9)
    steep = draft_cost([(1.0, 0.5), (7.0, 7.5)], per_step=True)  # a line through 0 or below: nothing per step
    assert steep.fixed_ms == pytest.approx(0.0) and steep.per_token_ms == pytest.approx(7.0 / 6.0)
    assert draft_cost([(7.0, 4.2)], per_step=True).ms(3) == pytest.approx(4.2)  # DSpark measured at one length
    assert draft_cost([(7.0, 7.0)], per_step=False).ms(3) == pytest.approx(3.0)  # MTP: per token
    assert draft_cost([(6.6, 3.0), (6.7, 3.3)], per_step=False).per_token_ms == pytest.approx(3.15 / 6.7)
    assert draft_cost([(6.8, 1.7), (6.8, 4.8)], per_step=True).fixed_ms == pytest.approx(3.25)  # a block of 8 caps both
    assert draft_lengths(7) == [4, 7] and draft_lengths(3) == [2, 3] and draft_lengths(2) == [1, 2] and draft_lengths(1) == [1]


def test_bench_speculate_prices_an_mtp_draft_per_token(tiny_models: dict[str, Path], draft_models: dict[str, Path]) -> None:
    result = run_pyllm("bench", "speculate", str(tiny_models["tiny-deepseek4"]), "--draft",
                       str(draft_models["tiny-deepseek4-mtp"]), "--draft-max", "2", "--depth", "16",
                       "--prompt-tokens", "16", "--gen-tokens", "16", "--repeat", "1", "--accept-len", "2")
    assert result.returncode == 0, result.stderr
    assert re.search(r"its own cost \d+\.\d{3} ms a step \+ \d+\.\d{3} ms per drafted token \(measured: "
                     r"\d+\.\d{3} ms at \d\.\d and \d+\.\d{3} ms at \d\.\d drafted a step\)", result.stdout), result.stdout
    assert "same tokens as without: yes" in result.stdout
    assert re.search(r"k=2 \d+\.\d\dx \((1\.\d\d)x\), k=3 \d+\.\d\dx \((1\.\d\d)x\)", result.stdout), result.stdout
    rows = [ln for ln in result.stdout.splitlines() if "accepted length 2 at 7 drafted" in ln]
    assert len(rows) == 1 and "x" in rows[0], result.stdout
    assert re.search(r"\d\.\d\dx \(k [12]\)\s*$", rows[0]) and "at most: the best draft length if every verify" in result.stdout


@pytest.mark.parametrize("args, says", [
    (["--accept-len", "9"], "accepted length 9: give the mean tokens a step yields with 7 drafted, between 1 and 8"),
    (["--accept-len", "2.5,x"], "--accept-len '2.5,x': give numbers separated by commas"),
    (["--acceptance", "1.5"], "--acceptance 1.5: a per-token acceptance is between 0 and 1"),
    (["--draft-max", "0"], "--draft-max 0: draft 1 to 15 tokens a step"),
    (["--draft-max", "12"], "--draft-max 12: this draft-dspark draft proposes at most 8 tokens a step (its trained block)"),
    (["--depth", "-1"], "--depth -1: give the tokens already in the context, 0 or more"),
])
def test_bench_speculate_refuses_bad_input_in_one_line(tiny_models: dict[str, Path], draft_models: dict[str, Path],
                                                       args: list[str], says: str) -> None:
    result = run_pyllm("bench", "speculate", str(tiny_models["tiny-deepseek4"]), "--draft",
                       str(draft_models["tiny-deepseek4-dspark"]), *args)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("draft", ["", "   "])
def test_bench_speculate_refuses_an_empty_draft(tiny_models: dict[str, Path], draft: str) -> None:
    result = run_pyllm("bench", "speculate", str(tiny_models["tiny-deepseek4"]), "--draft", draft)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and re.search(r"--draft ' *': give a draft GGUF", result.stderr), result.stderr  # the
    # error printer folds runs of spaces
