"""One GPU: llama-server -sm tensor vs -sm layer, greedy tokens on the tiny and 4-layer V4 (issue 23 item 1).

    python -m lab.runs.gpu_tensor_check /tmp/dec     # after python -m lab.runs.gpu_decode build models (its pin-bin, patched-bin, v4-4l.gguf)

Writes WORK/results-tensor.json and $OUT/tensor-check.json (lab/results/gpu-tensor-split-one-gpu.json).
"""
import json, os, subprocess, sys, httpx
from lab.gpucheck.build_server import BuildServer
w = sys.argv[1]; out = {}
models = {"tiny-deepseek4": f"{w}/tiny-v4.gguf", "v4-4l": f"{w}/v4-4l.gguf"}
if not os.path.exists(models["tiny-deepseek4"]):
    subprocess.run([sys.executable, "-m", "pyllm_a100", "synth", "tiny-deepseek4", "-o", models["tiny-deepseek4"], "--seed", "42"], check=True)
for build in ("pin", "patched"):
    for name, path in models.items():
        for mode in ("layer", "tensor"):
            server = BuildServer(f"{w}/{build}-bin", ["-m", path, "-ngl", "99", "-c", "2048", "-sm", mode, "-fa", "on",
                                 "--fit", "off", "-np", "1"], log_path=f"{w}/tensor-{build}-{name}-{mode}.log")
            key = f"{build}:{name}:{mode}"; r = {"argv": " ".join(server.argv[1:])}
            try:
                server.start()
                body = {"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "n_predict": 32, "temperature": 0, "top_k": 1, "cache_prompt": False,
                        "n_probs": 2, "ignore_eos": True, "return_tokens": True}
                j = httpx.post(server.base_url + "/completion", json=body, timeout=300).json()
                r["tokens"] = j.get("tokens"); r["timings"] = j.get("timings")
                r["top2_gaps"] = [round(c["top_probs"][0]["prob"] - c["top_probs"][1]["prob"], 4) for c in j.get("completion_probabilities", []) if len(c.get("top_probs", [])) > 1]
            except Exception as e:
                r["error"] = str(e)
            finally:
                server.stop()
            out[key] = r
            print(key, r.get("error") or r["tokens"][:8], flush=True)
for build in ("pin", "patched"):
    for name in models:
        a, b = out.get(f"{build}:{name}:layer", {}), out.get(f"{build}:{name}:tensor", {})
        ta, tb = a.get("tokens") or [], b.get("tokens") or []
        part = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        out[f"{build}:{name}:same"] = {"equal": bool(ta) and ta == tb, "first_difference": part,
                                       "gap_there": (a.get("top2_gaps") or [None] * 64)[part] if part is not None else None}
        print(build, name, out[f"{build}:{name}:same"], flush=True)
json.dump(out, open(f"{w}/results-tensor.json", "w"), indent=1)
os.makedirs(os.environ.get("OUT", w), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", w), "tensor-check.json"), "w"), indent=1)
