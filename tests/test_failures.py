"""llama.cpp failures -> one actionable line. The log lines are the pinned tree's own format strings
(ggml-cuda.cu, llama-model.cpp, server-http.cpp) filled in, since a CPU machine cannot produce them."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from pyllm_a100.process import failures
from pyllm_a100.serve.resolve import resolve
from pyllm_a100.serve.options import ServeOptions


@pytest.fixture
def config(tiny_deepseek4: Path):
    return resolve(ServeOptions(tiny_deepseek4, port=0, ctx_size=32768))


CASES = {
    "oom": ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 12288.00 MiB on device 3: cudaMalloc failed: out of memory\n"
            "llama_model_load: error loading model: unable to allocate CUDA3 buffer\n",
            ["out of GPU memory allocating 12.0 GiB on CUDA3", "lower --ctx-size (now 32768)", "--tensor-split 1x8"]),
    "oom at run time": ("CUDA error: out of memory\n  current device: 0, in function alloc at ggml-cuda.cu:500\n",
                        ["out of GPU memory", "pyllm doctor"]),
    "no kernel image": ("CUDA error: no kernel image is available for execution on the device\n",
                        ["this build has CUDA code for sm none only", "CMAKE_CUDA_ARCHITECTURES"]),
    "unknown arch": ("llama_model_load: error loading model: unknown model architecture: 'deepseek5'\n",
                     ["does not know the model architecture 'deepseek5'", "PYLLM_LLAMA_CPP_SOURCE"]),
    "port": ("srv init: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080\n", ["is already in use", "--port"]),
    "permission": ("gguf_init_from_file: failed to open GGUF file 'm.gguf' (Permission denied)\n", ["permission denied", "chmod"]),
}


@pytest.mark.parametrize("case", CASES)
def test_known_failures_become_one_line_with_the_fix(case: str, config) -> None:
    log, expected = CASES[case]
    line = failures.explain(log, 1, config, log_path=Path("/x/server.log"))
    assert "\n" not in line and line.endswith("(log: /x/server.log)")
    for text in expected:
        assert text in line, line


def test_unknown_failure_shows_exit_signal_and_the_telling_lines(config) -> None:
    log = "load_model: loading\nsomething went wrong: error 42\nbye\n"
    line = failures.explain(log, -signal.SIGSEGV, config)
    assert line.startswith("llama-server stopped (killed by SIGSEGV): something went wrong: error 42")
    assert "SIGKILL" in failures.explain("", -signal.SIGKILL, config)
