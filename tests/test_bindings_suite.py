"""llama-cpp-python's own test suite (from the pinned 0.3.36 sdist) against pyllm-a100's library: the ABI check.

Deselected, because each one downloads a model from the Hugging Face hub, which these
machines cannot reach: the tests built on the ``llama_cpp_*_model_path`` fixtures
(listed in DESELECTED). Everything else runs: version, tokenization on the sdist's
vocab-only llama-spm model, chat formats, grammars, speculative decoding helpers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pyllm_a100 import llama_source
from pyllm_a100.native import build_info

from conftest import REPO

NEEDS_HUB = "downloads a model from the Hugging Face hub"
DESELECTED = {
    "tests/test_llama.py::test_real_model": NEEDS_HUB,
    "tests/test_llama.py::test_real_llama": NEEDS_HUB,
    "tests/test_llama.py::test_real_llama_repeated_prompt_cache": NEEDS_HUB,
    "tests/test_llama.py::test_recurrent_model_prompt_cache_reset": NEEDS_HUB,
    "tests/test_llama.py::test_hybrid_model_prompt_cache_reset": NEEDS_HUB,
    "tests/test_llama.py::test_real_llama_embeddings": NEEDS_HUB,
    "tests/test_llama.py::test_exact_cached_prompt_reuse_matches_fresh": NEEDS_HUB,
    "tests/test_llama.py::test_loaded_exact_cached_prompt_reuse_matches_fresh": NEEDS_HUB,
    "tests/test_llama.py::test_ram_cache_exact_prompt_hit_matches_fresh": NEEDS_HUB,
    "tests/test_llama.py::test_shorter_prompt_prefix_reuse_matches_fresh": NEEDS_HUB,
}
BIND_FIRST = """\
import pyllm_a100  # binds llama_cpp to pyllm-a100's library before the tests import it
from pyllm_a100.bindings import llama_cpp_module, loaded_library
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
    return root


def test_llama_cpp_python_suite_passes_on_our_library(suite: Path, native_dir: Path) -> None:
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s", "tests"]
    for test_id in DESELECTED:
        args += ["--deselect", test_id]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run(args, cwd=suite, capture_output=True, text=True, env=env, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f"bound to {native_dir / 'libllama.so'}" in output
    summary = re.search(r"^(\d+) passed, (\d+) deselected in .*$", result.stdout, re.MULTILINE)
    assert summary, output[-2000:]
    assert int(summary[1]) >= 8 and int(summary[2]) >= len(DESELECTED), summary[0]
    assert "tests/test_llama.py::test_llama_cpp_tokenization" not in DESELECTED
