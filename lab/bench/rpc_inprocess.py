"""In-process llama.cpp with its layers split over rpc-servers (issue 56 item 2, "in-process Llama with the same
split"): ``pyllm_a100.Llama`` on a model, greedy tokens of the given prompts, printed as one JSON line. Run as a child
process, so that the A100 dispatch's LD_PRELOAD reaches the library and a crash is a dead child, not a dead run:

    python -m lab.bench.rpc_inprocess MODEL --rpc HOST:PORT[,...] --tensor-split 1xN --prompts FILE [--gen N] [--n-ctx N]

llama-cpp-python 0.3.36 has no RPC argument (its rpc_servers went with the device registry) and pyllm_a100.Llama
passes none through: when Llama takes no ``rpc`` keyword, the servers are registered here the way llama-server's
``--rpc`` does it (common/arg.cpp add_rpc_devices: the RPC backend's ggml_backend_rpc_add_server, then
ggml_backend_register), after which llama.cpp's default device list holds them (first, as in llama-server), and
Llama's tensor-split check is given the devices llama.cpp now has (it counts local GPUs only). The printed JSON says
which way it went (``how``), with llama.cpp's own layer assignment from its log.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import inspect
import io
import json
import sys


def register(endpoints: list[str]) -> int:
    """Add the rpc-servers to ggml's device registry; the number of devices it holds after."""
    from pyllm_a100.llamacpp.native import native_dir

    ggml = ctypes.CDLL(str(native_dir() / "libggml.so"))  # the copy libllama already loaded: one registry
    ggml.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RuntimeError("this build has no RPC backend (GGML_RPC off)")
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    add = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    for endpoint in endpoints:
        server = add(endpoint.encode())
        if not server:
            raise RuntimeError(f"ggml_backend_rpc_add_server({endpoint}) found no device there")
        ggml.ggml_backend_register(server)
    return int(ggml.ggml_backend_dev_count())


def counting(devices: int):
    """Llama's tensor-split check over every device llama.cpp has (the registered RPC ones too)."""

    def check(parts: list[float], n_devices: int, **_: object) -> None:
        if len(parts) > devices:
            raise ValueError(f"--tensor-split has {len(parts)} parts, llama.cpp has {devices} devices")

    return check


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--rpc", required=True)
    ap.add_argument("--tensor-split", required=True)
    ap.add_argument("--prompts", required=True, help="a JSON file: a list of token-id lists")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--n-ctx", type=int, default=4096)
    a = ap.parse_args()
    import pyllm_a100.embedded as embedded

    endpoints = [e for e in a.rpc.split(",") if e]
    prompts = json.load(open(a.prompts))
    logs = io.StringIO()
    if "rpc" in inspect.signature(embedded.Llama).parameters:  # the product's own way, once it has one
        how, options = "Llama(rpc=...)", {"rpc": a.rpc}
    else:
        how, options = "registered here (ggml_backend_rpc_add_server)", {}
        embedded.check_against_devices = counting(register(endpoints))
    with contextlib.redirect_stderr(logs):  # verbose: llama.cpp's log (the layer assignment) comes to stderr
        llm = embedded.Llama(a.model, n_gpu_layers=-1, tensor_split=a.tensor_split, n_ctx=a.n_ctx, verbose=True, **options)
        tokens = []
        for prompt in prompts:
            out: list[int] = []
            for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
                out.append(int(token))
                if len(out) == a.gen:
                    break
            tokens.append(out)
        llm.close()
    print(json.dumps({"how": how, "tokens": tokens, "log": logs.getvalue()[-200000:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
