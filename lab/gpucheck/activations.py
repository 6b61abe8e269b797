"""python -m lab.runs.activation_rms's measurements: activation scale of synthetic models read through llama.cpp's eval
callback in a fresh process, llama.cpp's own random test models, and gpu-check's comparison with an F32-KV CPU run
(or the GPU) in the other side's place."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

GPU_CHECK_PROMPT = [0, 271, 289, 300, 500, 700, 900]  # python -m lab.runs.gpu_check's fixed prompt ids
PAIRS = [("llama", "llama-dense", "tiny-llama"), ("deepseek4", "deepseek4-moe", "tiny-deepseek4"),
         ("glm-dsa", "glm-dsa-moe", "tiny-glm-dsa"), ("deepseek32", "deepseek32-moe", "tiny-deepseek32")]

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


def build(build_dir: Path, repo: Path) -> Path:
    """test-llama-archs from the checkout ``repo``'s vendored tree, CPU, in a scratch folder (ccache when installed)."""
    src = repo / "vendor" / "llama.cpp"
    if not (src / "tests" / "test-llama-archs.cpp").is_file():
        raise SystemExit(f"{src} has no tests/test-llama-archs.cpp: install the package once (it extracts the pinned tree)")
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=OFF", "-DGGML_RPC=OFF",
             "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
             "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF"]
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), *flags], check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "test-llama-archs", "-j", str(os.cpu_count() or 2)], check=True)
    return build_dir / "bin" / "test-llama-archs"


def test_model(archs_bin: Path, arch: str, stem: str, seed: int, out: Path) -> Path:
    path = out / f"{stem}.gguf"
    if not path.exists():
        subprocess.run([str(archs_bin), "-a", arch, "-s", str(seed), "-o", str(out)], check=True, capture_output=True)
    return path


def nmse(a, b) -> float:
    import numpy as np

    return float(np.mean((a - b) ** 2) / np.mean(a**2))


def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


SYNTH_AT = r"""
import sys
from pyllm_a100.synth import synthesize  # an exported pyllm_a100 of another revision (PYTHONPATH)
synthesize(sys.argv[1], sys.argv[2], seed=int(sys.argv[3]))
"""


class Synth:
    """Tiny presets written by this checkout's synth.py, or by the one of git revision ``rev`` of the checkout ``repo``."""

    def __init__(self, rev: str | None, work: Path, repo: Path) -> None:
        self.rev, self.src = rev, None
        self.work = work / (rev or "this")
        self.work.mkdir(parents=True, exist_ok=True)
        if rev:
            import tarfile
            from io import BytesIO

            self.src = Path(tempfile.mkdtemp(prefix="synth-at-"))
            packed = subprocess.run(["git", "-C", str(repo), "archive", rev, "pyllm_a100"], check=True, capture_output=True).stdout
            tarfile.open(fileobj=BytesIO(packed)).extractall(self.src)

    def model(self, preset: str, seed: int) -> Path:
        path = self.work / f"{preset}-seed{seed}.gguf"
        if path.exists():
            return path
        if self.src is None:
            from pyllm_a100.synth import synthesize

            synthesize(preset, path, seed=seed)
        else:
            from pyllm_a100.llamacpp.native import native_dir

            env = dict(os.environ, PYLLM_NATIVE_DIR=str(native_dir()), PYTHONPATH=str(self.src))
            subprocess.run([sys.executable, "-c", SYNTH_AT, preset, str(path), str(seed)],
                           check=True, env=env, cwd=tempfile.gettempdir())
        return path

    @property
    def label(self) -> str:
        return f"`{{}}` at {self.rev}" if self.rev else "`{}`"


def kv_proxy(synth: Synth, preset: str, seed: int, gpu: bool = False) -> dict:
    """gpu-check's comparison with an F32-KV CPU run standing in for the GPU: the prompt, 16 greedy tokens of
    the default (F16 KV) CPU run as teacher, then teacher-forced logits with F16 and with F32 KV. With ``gpu``
    the other side is the GPU with the default F16 KV cache, as gpu-check compares."""
    import numpy as np

    from pyllm_a100.synth import PRESETS

    model = synth.model(preset, seed)
    n_used = PRESETS[preset].hparams.get("n_expert_used", 2)
    teacher = probe(model, GPU_CHECK_PROMPT, n_used, False, synth.work, generate=16)["tokens"]
    seq = GPU_CHECK_PROMPT + teacher[:-1]
    f16, f32 = probe(model, seq, n_used, False, synth.work), probe(model, seq, n_used, not gpu, synth.work, gpu=gpu)
    a, b = np.load(f32["logits_path"])[len(GPU_CHECK_PROMPT) - 1:], np.load(f16["logits_path"])[len(GPU_CHECK_PROMPT) - 1:]
    top2 = np.sort(a, axis=1)[:, -2:]
    flips = sum(int((np.array(x["chosen"]) != np.array(y["chosen"])).any(axis=1).sum())
                for x, y in zip(f16["layers"], f32["layers"]) if "chosen" in x)
    decisions = sum(len(x["chosen"]) for x in f32["layers"] if "chosen" in x)
    margins = [x["margin_min"] for x in f32["layers"] if "margin_min" in x]
    moved = [np.array(x["scores"]) - np.array(y["scores"]) for x, y in zip(f16["layers"], f32["layers"]) if "scores" in x]
    return {"preset": preset, "seed": seed, "rev": synth.rev, "nmse": nmse(a, b), "flips": flips, "decisions": decisions,
            "score_error": float(np.sqrt(np.mean(np.concatenate([m.ravel() for m in moved]) ** 2))) if moved else None,
            "router_margin_min": min(margins) if margins else None, "top2_gap_min": float((top2[:, 1] - top2[:, 0]).min())}
