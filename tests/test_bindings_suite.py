"""llama-cpp-python's own test suite (from the pinned 0.3.36 sdist) against pyllm-a100's library: the ABI check.

All of it runs, including the tests built on models from the Hugging Face hub, which these
machines cannot reach. Their fixtures call ``hf_hub_download(repo_id, filename)``; with
``HF_HUB_OFFLINE=1`` huggingface_hub answers that from its cache folder (``HF_HUB_CACHE``)
without a request, so the files are laid out there, under the names the fixtures ask for:

- the transformer models (their Qwen3.5-0.8B and stories15M) -> SmolLM2-135M-Instruct, the real
  model this session fetched from its package;
- the embedding model (their bge-small, a BERT with pooling) -> the same SmolLM2 weights with
  ``llama.pooling_type = mean`` added (gguf's own copy-with-new-metadata). Without pooling,
  llama-cpp-python 0.3.36's ``Llama.embed`` of a list reads every sequence after the first at
  the wrong offset (``pos += size`` counts tokens, not floats): their batched-equals-single
  test fails on any generative model, which is their bug, not a capability this machine lacks;
- the recurrent model (their Mamba-130M) -> ``tiny-mamba``, synthetic Mamba-1;
- the hybrid model (their Falcon-H1-90M) -> ``tiny-deepseek4``, synthetic DeepSeek-V4 (llama.cpp
  counts it as hybrid: attention plus compressor state).

Their fixture code is untouched. Assertions that hold only for the upstream model's own
tokenizer or weights are rewritten for SmolLM2 (MODEL_SPECIFIC; each must match as often as
listed, so a new sdist that changes them fails here instead of passing silently).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pyllm_a100.llamacpp import llama_source
from pyllm_a100.llamacpp.native import build_info

from conftest import REPO

# Their model fixture -> our model: "smollm2" (real) or a synth preset.
SUBSTITUTES = {
    "llama_cpp_model_path": "smollm2",
    "llama_cpp_transformer_model_path": "smollm2",
    "llama_cpp_embedding_model_path": "smollm2-mean-pooling",
    "llama_cpp_recurrent_model_path": "tiny-mamba",
    "llama_cpp_hybrid_model_path": "tiny-deepseek4",
}
FIXTURE_RE = re.compile(r'def (llama_cpp_\w*model_path)\(\):\s+repo_id = "([^"]+)"\s+filename = "([^"]+)"')
# (file, upstream text, times it appears, replacement, why)
MODEL_SPECIFIC = [
    ("tests/test_llama.py", "assert tokens == [9419, 11, 1814, 0]", 1, "assert tokens == [19556, 28, 905, 17]",
     "Qwen3.5's token ids for 'Hello, world!'; SmolLM2's are 'Hello' ',' ' world' '!' = 19556 28 905 17"),
    ("tests/test_llama.py", '== " jumps over the lazy dog."', 2, '== " is a classic example of a"',
     "Qwen3.5's greedy 6 tokens after 'The quick brown fox jumps over the lazy dog. The quick brown fox'; SmolLM2's"),
]
# A deselection must name a capability this machine lacks; none is needed today.
DESELECTED: dict[str, str] = {}
BIND_FIRST = """\
import pyllm_a100  # binds llama_cpp to pyllm-a100's library before the tests import it
from pyllm_a100.llamacpp.bindings import llama_cpp_module, loaded_library
import llama_cpp.llama_cpp

llama_cpp_module()
print("bound to", loaded_library(llama_cpp.llama_cpp))
"""


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pin = llama_source.Pin(**build_info()["pin"])
    sdist = REPO / "vendor" / "downloads" / pin.sdist
    if not sdist.exists() or llama_source.sha256_of(sdist) != pin.sha256:
        sdist = llama_source.download_sdist(pin, tmp_path_factory.mktemp("sdist"))
    root = tmp_path_factory.mktemp("llama-cpp-python-tests")
    top = sdist.name.removesuffix(".tar.gz")
    wanted = ("tests/", "vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf")
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name.removeprefix(top + "/")
            if rel.startswith(wanted):
                m.name = rel
                members.append(m)
        tar.extractall(root, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (root / "conftest.py").write_text(BIND_FIRST)
    for name, upstream, times, ours, _why in MODEL_SPECIFIC:
        path = root / name
        text = path.read_text()
        assert text.count(upstream) == times, f"{name}: {upstream!r} is not in the pinned tests {times}x any more: review MODEL_SPECIFIC"
        path.write_text(text.replace(upstream, ours))
    return root


@pytest.fixture(scope="module")
def hub_cache(suite: Path, smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """huggingface_hub's cache layout (models--OWNER--NAME/refs/main, snapshots/COMMIT/FILE) holding our models
    under the repo and file names their fixtures ask for."""
    from pyllm_a100.synth import synthesize

    asked = FIXTURE_RE.findall((suite / "tests" / "test_llama.py").read_text())
    assert {fixture for fixture, _, _ in asked} == set(SUBSTITUTES), f"the pinned tests' model fixtures changed: {asked}"
    models = tmp_path_factory.mktemp("peer-models")
    cache = tmp_path_factory.mktemp("hf-hub-cache")
    commit = "0" * 40
    for fixture, repo_id, filename in asked:
        ours = SUBSTITUTES[fixture]
        source = smollm2 if ours == "smollm2" else models / f"{ours}.gguf"
        if ours == "smollm2-mean-pooling" and not source.exists():
            with_pooling(smollm2, source, pooling=1)  # LLAMA_POOLING_TYPE_MEAN
        elif not source.exists():
            synthesize(ours, source, seed=42)
        repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / "main").write_text(commit)
        target = repo_dir / "snapshots" / commit / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)
    return cache


def with_pooling(source: Path, target: Path, pooling: int) -> Path:
    """A copy of ``source`` with ``ARCH.pooling_type`` set: same tensors, an embedding model's metadata."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target, arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {f"{arch}.pooling_type": MetadataDetails(gguf.GGUFValueType.UINT32, pooling)}, [])
    return target


def test_llama_cpp_python_suite_passes_on_our_library(suite: Path, hub_cache: Path, native_dir: Path) -> None:
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", "-rs", "tests"]
    for test_id in DESELECTED:
        args += ["--deselect", test_id]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub_cache))
    result = subprocess.run(args, cwd=suite, capture_output=True, text=True, env=env, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f"bound to {native_dir / 'libllama.so'}" in output
    summary = re.search(r"^(\d+) passed(?:, (\d+) deselected)? in .*$", result.stdout, re.MULTILINE)
    assert summary, output[-2000:]
    assert int(summary[1]) >= 26 and int(summary[2] or 0) == len(DESELECTED), summary[0]  # nothing skipped or failed
