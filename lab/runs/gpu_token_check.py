"""Greedy tokens of each patched build against the pin's, on the GPU (issue 23 item 3: exactness end to end).

    python -m lab.runs.gpu_token_check /tmp/dec [BUILD[+ENV][@DISPATCH]...] [--dispatch native|a100] [--dispatch-shim PATH]
        # after python -m lab.runs.gpu_decode build models (or python -m lab.runs.gpu_build); default: every build (and
        # patched+UNFUSED while lab/bench/decode_switches.py has it); +SWITCH: gpu-decode's switches, +HC_NORM ... +HC_ADD
        # (0022's fusions one at a time); @a100: the A100 dispatch (lab/scripts/a100-dispatch.c preloaded), @native the
        # GPU's own; --dispatch: the default of specs without @ (issue 41: pin@a100 patched@a100 pin patched)

llama-server -ngl 99 -fa on -np 1 on the tiny and the 4-layer real-shape V4 (and each --model NAME=PATH); two prompts
(--prompt-lengths): 8 tokens (CSA blocks complete while generating) and 300 tokens (HCA's 128-token blocks complete in the prompt, several CSA blocks per ubatch with
-ub 64); 48 greedy tokens each, with every step's top-4 log-probabilities (compared bit for bit with the pin's, and a
BUILD+SWITCH column's also with BUILD's: an exact patch leaves them equal; pin_logprobs_matched counts the pin's steps
found bit-identical in order, since the pin leaves out the steps of tokens that end inside a UTF-8 character). Each
spec is compared with the pin of ITS dispatch; an @a100 spec whose native twin ran is also compared with it
(dispatch_changes_tokens: the A100 host paths give other kernels, so other rounding). Every entry records its dispatch and
the compute capability its llama-server logged. Writes WORK/results-tokens.json and $OUT/token-check.json.
"""
import argparse, json, os, subprocess, sys
import httpx
from lab.bench import dispatch as dsp
from lab.bench.decode_switches import ENV_COLUMNS
from lab.gpucheck.build_server import BuildServer


def pin_entries_matched(pin, lp):
    """How many of the pin's steps appear in lp, bit for bit and in order. The pin drops the entry of a token that ends
    inside a UTF-8 character (patch 0015 keeps it), so its list can be shorter and a step-by-step comparison misaligns."""
    n = 0
    for step in lp or []:
        if n < len(pin or []) and step == pin[n]:
            n += 1
    return n


ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("work")
ap.add_argument("specs", nargs="*", metavar="BUILD[+SWITCH...][@DISPATCH]")
ap.add_argument("--reference", default="pin", help="the build every other is compared with (default pin; e.g. the "
                "series without its newest patch)")
ap.add_argument("--model", action="append", default=[], metavar="NAME=PATH", help="check this file too (repeatable; "
                "e.g. v4-4l-256=WORK/v4-4l-256.gguf, DeepSeek-V4 with all 256 experts)")
ap.add_argument("--prompt-lengths", default="8,300", help="prompt lengths in tokens (default 8,300; 16: one ubatch "
                "whose 96 (token, expert) pairs fit 256 experts)")
dsp.add_arguments(ap)
a = ap.parse_args()
extra_models = dict(m.partition("=")[::2] for m in a.model)
if not all(name and path for name, path in extra_models.items()):
    ap.error("--model NAME=PATH: give both, e.g. v4-4l-256=/tmp/dec/v4-4l-256.gguf")
try:
    lengths = [int(x) for x in a.prompt_lengths.split(",")]
except ValueError:
    lengths = []
if not lengths or min(lengths) < 1:
    ap.error(f"--prompt-lengths {a.prompt_lengths!r}: positive integers separated by commas, e.g. 8,16,300")
w = a.work
DISPATCH = dsp.from_args(a, build_dir=w)
builds = a.specs or sorted(d[:-4] for d in os.listdir(w) if d.endswith("-bin") and d != "patched-bin") + \
    (["patched+UNFUSED"] if "UNFUSED" in ENV_COLUMNS else [])
# gpu-decode's bench switches (one list for both scripts), and 0022's fusions one at a time for a bisection
ENVS = dict(ENV_COLUMNS, **{f"HC_{n.upper()}": {"GGML_CUDA_DSV4_HC_FUSION": n} for n in ("norm", "pre", "post", "ffn", "add")})
try:
    parsed = [DISPATCH.split(spec) for spec in builds]
except dsp.DispatchError as e:
    sys.exit(str(e))
builds = [dsp.column_name(b, d) for b, d in parsed]  # results are keyed by the column's name: patched, patched@a100
unknown = {n for b, _ in parsed for n in b.split("+")[1:] if n not in ENVS}
if unknown:
    sys.exit(f"unknown switch {', '.join(sorted(unknown))}: use {', '.join(ENVS)} (BUILD+NAME[+NAME...][@DISPATCH])")
if not os.path.isdir(w):
    ap.error(f"{w}: no such folder (the work folder of python -m lab.runs.gpu_build, with BUILD-bin in it)")
missing = sorted({b.split("+")[0] for b, _ in parsed if not os.path.isdir(os.path.join(w, b.split("+")[0] + "-bin"))})
if missing:
    ap.error(f"no build {', '.join(missing)} in {w} (python -m lab.runs.gpu_build LABEL writes {w}/LABEL-bin)")


def column(spec):  # "patched+HC@a100" -> ("patched", the switches' and the dispatch's environment, "a100")
    base, disp = DISPATCH.split(spec)
    return base.split("+")[0], dict({k: v for n in base.split("+")[1:] for k, v in ENVS[n].items()}, **DISPATCH.env(disp)), disp


models = {"tiny-deepseek4": f"{w}/tiny-v4.gguf", "v4-4l": f"{w}/v4-4l.gguf", **extra_models}
# p8: ids 1..8 (as before); longer prompts: ids < the tiny vocab (1024)
prompts = {f"p{n}": list(range(1, 9)) if n == 8 else [(i * 37) % 900 + 10 for i in range(n)] for n in lengths}
if not os.path.exists(models["tiny-deepseek4"]):
    subprocess.run([sys.executable, "-m", "pyllm_a100", "synth", "tiny-deepseek4", "-o", models["tiny-deepseek4"], "--seed", "42"], check=True)
out, dispatch = {}, {}
for spec in builds:
    build, env, disp = column(spec)  # several switches: patched+HC+POOLSPLIT
    for name, path in models.items():
        log = f"{w}/tokens-{spec}-{name}.log"
        server = BuildServer(f"{w}/{build}-bin", ["-m", path, "-ngl", "99", "-c", "4096", "-fa", "on", "--fit", "off",
                             "-np", "1", "-ub", "64"], log_path=log, extra_env=env or None)
        try:
            server.start()
            for pname, prompt in prompts.items():
                body = {"prompt": prompt, "n_predict": 48, "temperature": 0, "top_k": 1, "cache_prompt": False,
                        "ignore_eos": True, "return_tokens": True, "n_probs": 4}
                j = httpx.post(server.base_url + "/completion", json=body, timeout=300).json()
                # the top-4 log-probabilities of every step: equal bits here mean equal logits, not only equal argmaxes
                logprobs = [[t.get("logprob") for t in step.get("top_logprobs", [])] for step in j.get("completion_probabilities") or []]
                out[f"{spec}:{name}:{pname}"] = {"tokens": j.get("tokens"), "logprobs": logprobs,
                                                 "decode_tps": (j.get("timings") or {}).get("predicted_per_second"),
                                                 **({} if j.get("tokens") else {"error": str(j)[:500]})}
        except Exception as e:
            out[f"{spec}:{name}:error"] = str(e)
        finally:
            server.stop()
            rec = dsp.record(disp, open(log, errors="replace").read() if os.path.exists(log) else "")
            for pname in prompts:
                out.get(f"{spec}:{name}:{pname}", {}).update(dispatch=disp, reported_capability=rec["reported_capability"])
            if not dispatch.get(spec, {}).get("reported_capability"):
                dispatch[spec] = rec


def same(x, y):  # (tokens equal, first difference, logprobs equal) of two runs of one case
    tx, ty = x.get("tokens") or [], y.get("tokens") or []
    first = next((i for i, (p, q) in enumerate(zip(tx, ty)) if p != q), None)
    return bool(tx) and tx == ty, first, bool(x.get("logprobs")) and x.get("logprobs") == y.get("logprobs")


summary = {}
for key, r in list(out.items()):
    spec, name, pname = key.split(":")
    base, disp = DISPATCH.split(spec)
    pin_key = f"{dsp.column_name(a.reference, disp)}:{name}:{pname}"  # the reference of the same dispatch
    if pname == "error":
        continue
    if base == a.reference:
        twin = out.get(f"{a.reference}:{name}:{pname}") if disp != "native" else None
        if twin:  # the pin under the A100 dispatch against the pin's native run
            summary[key] = dict(zip(("equal_to_native", "first_difference_from_native", "logprobs_equal_to_native"), same(r, twin)))
            print(key, summary[key], flush=True)
        continue
    ref = out.get(pin_key, {}).get("tokens")
    toks = r.get("tokens") or []
    first = next((i for i, (x, y) in enumerate(zip(ref or [], toks)) if x != y), None)
    pin_lp = out.get(pin_key, {}).get("logprobs") or []
    summary[key] = {"reference": pin_key.split(":")[0], "equal_to_pin": bool(ref) and toks == ref, "first_difference": first,
                    "logprobs_equal_to_pin": bool(r.get("logprobs")) and r.get("logprobs") == pin_lp,
                    "pin_logprobs_matched": f"{pin_entries_matched(pin_lp, r.get('logprobs'))}/{len(pin_lp)}"}
    if "+" in base:  # a switch: the same build without it (one patch on or off, bit for bit)
        plain = out.get(f"{dsp.column_name(base.split('+')[0], disp)}:{name}:{pname}", {}).get("logprobs")
        summary[key]["logprobs_equal_to_build"] = bool(plain) and r.get("logprobs") == plain
    twin = out.get(f"{base}:{name}:{pname}") if disp != "native" else None
    if twin:  # the same build's native run: does the A100 dispatch change the tokens?
        summary[key].update(zip(("equal_to_native", "first_difference_from_native", "logprobs_equal_to_native"), same(r, twin)))
    print(key, summary[key], flush=True)
out["summary"] = summary
out["dispatch"] = dispatch
out["reported_capability"] = {spec: d.get("reported_capability") for spec, d in dispatch.items()}
pinned = [v for v in summary.values() if "equal_to_pin" in v]
out["all_equal"] = bool(pinned) and all(v["equal_to_pin"] for v in pinned)
print("all equal to the pin of their dispatch:", out["all_equal"], flush=True)
json.dump(out, open(f"{w}/results-tokens.json", "w"), indent=1)
os.makedirs(os.environ.get("OUT", w), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", w), "token-check.json"), "w"), indent=1)
