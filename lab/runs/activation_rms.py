"""Activation scale of a model read through llama.cpp's eval callback, in a fresh process (tests/test_synth.py checks
that synthetic weights keep a trained model's range with it).

    python -m lab.runs.activation_rms MODEL.gguf [--tokens 48] [--used 2]   # per layer: residual RMS, change, K rows, routers

The investigation that compared synthetic models with llama.cpp's own random test models, and gpu-check's F16/F32 KV
proxy, left the tree (issue 60): ``git show cf107d3:lab/runs/activation_rms.py`` and ``cf107d3:lab/gpucheck/activations.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import ctypes, json, re, sys
import numpy as np
from pyllm_a100 import Llama  # noqa: F401  (binds llama_cpp to this package's library)
import llama_cpp as L
from pyllm_a100.llamacpp.native import native_dir

job = json.loads(sys.argv[1])
g = ctypes.CDLL(str(native_dir() / "libggml-base.so"))
g.ggml_get_name.restype, g.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
g.ggml_nelements.restype, g.ggml_nelements.argtypes = ctypes.c_int64, [ctypes.c_void_p]
g.ggml_nbytes.restype, g.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
g.ggml_is_contiguous.restype, g.ggml_is_contiguous.argtypes = ctypes.c_bool, [ctypes.c_void_p]
g.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
WANTED = re.compile(r"^(l_out|l_last|Kcur|kv_norm|ffn_moe_logits|ffn_moe_probs|ffn_moe_probs_biased|ffn_moe_argsort)-(\d+)$")
F32, I32 = 0, 26
seen = {}

def read(t):
    kind = ctypes.c_int32.from_address(t).value
    ne = list((ctypes.c_int64 * 4).from_address(t + 16))
    if kind not in (F32, I32) or not g.ggml_is_contiguous(t):
        return None
    buf = np.empty(g.ggml_nelements(t), dtype=np.float32 if kind == F32 else np.int32)
    g.ggml_backend_tensor_get(t, buf.ctypes.data, 0, g.ggml_nbytes(t))
    return buf.reshape(ne[3], ne[2], ne[1], ne[0])

@L.ggml_backend_sched_eval_callback
def callback(t, ask, _):
    name = g.ggml_get_name(t).decode()
    if ask:
        return bool(WANTED.match(name))
    values = read(t)
    if values is not None:
        seen[name] = values  # the last tensor of that name in the graph
    return True

L.llama_backend_init()
mp = L.llama_model_default_params()
mp.n_gpu_layers = 999 if job["gpu"] else 0
model = L.llama_model_load_from_file(job["model"].encode(), mp)
cp = L.llama_context_default_params()
n = len(job["tokens"])
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 512, 512, 512, 2, 2
cp.type_k = cp.type_v = 0 if job["kv_f32"] else 1  # GGML_TYPE_F32 / F16
cp.flash_attn_type = 0  # off: per-node activations of the plain attention path (the CPU's flash attention rounds K/V to F16 either way)
cp.cb_eval, cp.cb_eval_user_data = callback, None
ctx = L.llama_init_from_model(model, cp)
vocab = L.llama_model_get_vocab(model)
n_vocab = L.llama_vocab_n_tokens(vocab)

def decode(tokens, start):
    batch = L.llama_batch_init(len(tokens), 0, 1)
    for i, tok in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, start + i, 1, 1
        batch.seq_id[i][0] = 0
    batch.n_tokens = len(tokens)
    assert L.llama_decode(ctx, batch) == 0
    L.llama_batch_free(batch)

if job.get("generate"):  # greedy, end-of-generation tokens never chosen (as llama-server's ignore_eos)
    eog = [i for i in range(n_vocab) if L.llama_vocab_is_eog(vocab, i)]
    seq, out = list(job["tokens"]), []
    decode(seq, 0)
    while len(out) < job["generate"]:
        last = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        last[eog] = -np.inf
        out.append(int(last.argmax()))
        decode(out[-1:], len(seq) + len(out) - 1)
    print(json.dumps({"tokens": out}))
    sys.exit(0)
decode(job["tokens"], 0)
logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n, n_vocab)).astype(np.float64)
np.save(job["logits"], logits)

def rms(a):
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))

layers = {}
for name, v in seen.items():
    m = re.match(r"^(.*)-(\d+)$", name)
    if m:
        layers.setdefault(int(m[2]), {})[m[1]] = v
out = {"layers": [], "logits_std": float(logits.std(axis=1).mean())}
import gguf
from gguf.quants import dequantize
embd = next(t for t in gguf.GGUFReader(job["model"]).tensors if t.name == "token_embd.weight")
prev = dequantize(embd.data, embd.tensor_type).reshape(-1, int(embd.shape[0]))[job["tokens"]]  # the rows fed in
out["embedding_rms"] = rms(prev)
for il in sorted(layers):
    t = layers[il]
    row = {"layer": il}
    resid = t.get("l_out", t.get("l_last"))
    if resid is not None:
        row["resid"] = rms(resid)
        now = resid.reshape(n, -1, prev.shape[-1])  # DeepSeek-V4: (tokens, streams, n_embd)
        row["change"] = rms(now - prev.reshape(n, -1, prev.shape[-1])) / rms(prev)  # how much this layer moved the stream
        prev = now
    k = t.get("Kcur", t.get("kv_norm"))
    if k is not None:
        row["k"] = rms(k)
    if "ffn_moe_logits" in t:
        row["router_std"] = float(t["ffn_moe_logits"].std(axis=-1).mean())
    score = t.get("ffn_moe_probs_biased", t.get("ffn_moe_probs"))
    if score is not None and "ffn_moe_argsort" in t and job["n_used"] < score.shape[-1]:
        order = t["ffn_moe_argsort"].reshape(-1, t["ffn_moe_argsort"].shape[-1])
        k = job["n_used"]
        s = score.reshape(-1, score.shape[-1])
        srt = -np.sort(-s, axis=1)
        row["margin_min"] = float((srt[:, k - 1] - srt[:, k]).min())
        row["margin_median"] = float(np.median(srt[:, k - 1] - srt[:, k]))
        row["chosen"] = np.sort(order[:, :k], axis=1).tolist()
        row["scores"] = s.tolist()
    out["layers"].append(row)
print(json.dumps(out))
"""


def probe(model: Path, tokens: list[int], n_used: int, kv_f32: bool, work: Path, generate: int = 0, gpu: bool = False) -> dict:
    """One teacher-forced pass in a fresh process (CPU with CUDA hidden, or every layer on the GPU): per-layer
    statistics and the logits (saved as .npy); with ``generate`` the greedy continuation of ``tokens`` instead."""
    logits = work / f"{model.stem}-{'gpu' if gpu else 'cpu'}-{'f32' if kv_f32 else 'f16'}.npy"
    job = {"model": str(model), "tokens": tokens, "n_used": n_used, "kv_f32": kv_f32, "logits": str(logits),
           "generate": generate, "gpu": gpu}
    env = dict(os.environ, **({} if gpu else {"CUDA_VISIBLE_DEVICES": ""}))  # else big batches are offloaded anyway
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(job)], capture_output=True, text=True,
                         cwd=tempfile.gettempdir(), timeout=600, env=env)
    if out.returncode != 0:
        raise SystemExit(f"probe of {model.name} failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["logits_path"] = str(logits)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--tokens", type=int, default=48, help="teacher-forced token ids (seeded, 20..999)")
    parser.add_argument("--used", type=int, default=2, help="experts each token uses (the router margin's k)")
    args = parser.parse_args()
    from lab.bench.native_view import use_installed_build

    use_installed_build()  # the checkout's source tree (python -m from the root) on the installed package's build
    import numpy as np

    tokens = [int(t) for t in np.random.default_rng(0).integers(20, 1000, args.tokens)]
    with tempfile.TemporaryDirectory() as work:
        result = probe(args.model, tokens, args.used, True, Path(work))
    for row in result["layers"]:
        print(json.dumps({k: v for k, v in row.items() if k not in ("chosen", "scores")}))
    print(json.dumps({"embedding_rms": result["embedding_rms"], "logits_std": result["logits_std"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
