"""Write the compatibility tables from the GPU check's results (never typed by hand).

    python -m lab.tools.render_compat            # rewrite the tables between their markers: the full table with its evidence in
                                         # docs/models.md (compat-table), the short one in README.md (status-table), the
                                         # thinking switches in docs/serving.md (thinking-table)
    python -m lab.tools.render_compat --check    # exit 1 if any of them differs from what the results give

The "tool calls / reasoning" column and the table of thinking switches come from
pyllm_a100/synth/chat.py (the chat template each family's presets embed; tests/test_tools.py
checks its switches against the templates' generation prompts), loaded by path.

Reads every lab/results/gpu-check*.json (the GPU check's output, one file per run: python -m lab.runs.gpu_check
at commit cf107d3, which left the tree with issue 60;
for a step found in several runs the latest run counts). Status per model family:
  verified on GPU       the tiny preset passed on the GPU: temperature-0 tokens equal to the
                        CPU's, or teacher-forced logits NMSE <= 1e-4, through the managed
                        server and in-process Llama (for llama also the real-weight model of
                        gpu-check --real-model, 64 tokens, when a GPU run has it; when lab/results/gpu-kld.json
                        exists, its KL divergence (python -m lab.runs.gpu_kld at cf107d3) decides the
                        real-weight part instead: the GPU's figures within the CPU runs' noise, RULE below);
  verified on CPU only  the build loads and runs the architecture (the test suite checks
                        every tiny preset on CPU) but the GPU check failed or has not run;
  unsupported           this build's llama.cpp does not know the architecture.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

from lab.bench.native_view import use_installed_build

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "lab" / "results"
README = REPO / "README.md"
BEGIN, END = "<!-- compat-table -->", "<!-- /compat-table -->"
THINKING = ("<!-- thinking-table -->", "<!-- /thinking-table -->")
STATUS = ("<!-- status-table -->", "<!-- /status-table -->")
MODELS_DOC, SERVING_DOC = REPO / "docs" / "models.md", REPO / "docs" / "serving.md"

# family, GGUF architecture, the synthetic preset that stands for it
FAMILIES = [
    ("DeepSeek-V4-Flash", "deepseek4", "tiny-deepseek4"),
    ("GLM-5, 5.1, 5.2", "glm-dsa", "tiny-glm-dsa"),
    ("DeepSeek-V3.2", "deepseek32", "tiny-deepseek32"),
    ("Llama-architecture dense models", "llama", "tiny-llama"),
]


def chat_module():
    """pyllm_a100/synth/chat.py of this checkout (plain data: no build or install needed)."""
    spec = importlib.util.spec_from_file_location("pyllm_chat_formats", REPO / "pyllm_a100" / "synth" / "chat.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks the module up by name
    spec.loader.exec_module(module)
    return module


def tools_text(arch: str) -> str:
    """The tool calls / reasoning column: the family's markup, the pin's parser for it, the thinking switch."""
    fmt = chat_module().chat_format(arch)
    if fmt is None:
        return "the model's own chat template (llama.cpp picks the format from it; not checked here)"
    return f"{fmt.tool_calls} ({fmt.parser}); thinking off: `chat_template_kwargs` {fmt.switches()}"


def thinking_table() -> str:
    """docs/serving.md's table of thinking switches per family (section Tool calls and reasoning)."""
    chat = chat_module()
    lines = ["| family (template the presets embed) | thinking off | thinking on | reasoning comes back as |",
             "| --- | --- | --- | --- |"]
    for family, arch, _ in FAMILIES:
        fmt = chat.chat_format(arch)
        if fmt is not None:
            lines.append(f"| {fmt.models} (`{arch}`, `{fmt.template}`) | {fmt.switches()} | "
                         f'`{{"{fmt.thinking_key}": true}}` (the default) | `reasoning_content` |')
    return "\n".join(lines) + "\n"


def load_runs(results: Path) -> tuple[dict, dict, list[str]]:
    """Steps and preset results merged over every run, the later run winning; the run dates."""
    steps: dict = {}
    presets: dict = {}
    dates = []
    runs = sorted((json.loads(p.read_text()) for p in results.glob("gpu-check*.json")), key=lambda r: r["started"])
    for run in runs:
        dates.append(run["started"])
        steps.update({k: v for k, v in run["steps"].items() if v.get("ok")})
        presets.update({p["preset"]: p for p in run.get("presets", [])})
    return steps, presets, dates


def known_architectures() -> list[str] | None:
    try:
        from pyllm_a100.models.gguf_files import known_architectures as known

        return known()
    except Exception:  # no build here: the status then rests on the results alone
        return None


def evidence(preset: str, result: dict | None) -> tuple[str, str]:
    if result is None:
        return "verified on CPU only", "no GPU check of this preset yet"
    same = result["server_tokens_equal"] and result.get("in_process_tokens_equal")
    nmse = result.get("logits_nmse")
    figures = f"logits NMSE {nmse:.1e}" if nmse is not None else "no in-process result"
    if result["pass_server"] and result["pass_in_process"]:
        tokens = "16/16 tokens GPU = CPU (server and in-process)" if same else "tokens part by rounding"
        return "verified on GPU", f"`{preset}`: {tokens}, {figures}"
    text = f"`{preset}` runs on the GPU but differs from the CPU: "
    if "first_difference" in result:
        text += (f"tokens part at token {result['first_difference'] + 1} (the CPU's top two "
                 f"{result['cpu_top2_gap']:.4f} apart), ")
    text += f"{figures} > 1e-4 with the default F16 KV cache"
    f32 = result.get("kv_f32")
    if f32 and f32.get("logits_nmse") is not None:
        verdict = "passes" if f32["pass_server"] and f32["pass_in_process"] else "still fails"
        text += f"; with `-ctk f32 -ctv f32` NMSE {f32['logits_nmse']:.1e} ({verdict})"
    return "verified on CPU only", text


def serving_text(serving: dict | None, preset: str, arch: str) -> str:
    """The serving-soak column: requests, errors and crashes over every type and --parallel of the preset."""
    if not serving:
        return "not run"
    def summary(cases: list[dict]) -> str:
        requests = sum(c.get("requests", 0) for c in cases)
        errors = sum(c.get("http_errors", 0) for c in cases)
        crashes = sum(c.get("crashes", 0) for c in cases)
        failed = sum(1 for c in cases if c.get("error"))
        text = f"{crashes} crashes, {errors} HTTP errors in {requests} requests"
        return text + (f", {failed} case(s) did not start" if failed else "")
    tiny = [c for c in serving.get("cases", []) if c["preset"] == preset]
    if not tiny:
        return "not run"
    types = sorted({c["type"] for c in tiny}, key=str)
    nmse = {n["type"]: n["max"] for n in serving.get("nmse", []) if n["preset"] == preset and "max" in n}
    text = f"`{preset}` × {'/'.join(types)} × `--parallel` default/16: {summary(tiny)}"
    if nmse:
        quantized = [v for t, v in nmse.items() if t != "f16"]
        text += "; teacher-forced logits NMSE per prompt length: " + ", ".join(
            part for part in (f"f16 ≤ {nmse['f16']:.0e}" if "f16" in nmse else "",
                              f"quantized ≤ {max(quantized):.0e}" if quantized else "") if part)
    real_prefix = {"deepseek4": "deepseek-v4-flash-", "glm-dsa": "glm-5-"}.get(arch)
    real = [c for c in serving.get("cases", []) if real_prefix and c["preset"].startswith(real_prefix)]
    if real:
        cut = re.search(r"(\d+)l(?:-e(\d+))?$", real[0]["preset"])
        shape = f"{cut[1]} layers" + (f" × {cut[2]} experts" if cut and cut[2] else "") if cut else real[0]["preset"]
        text += f"; real shape cut to {shape}, `--tensor-split {real[0]['gpus']}`: {summary(real)}"
    return text


# The KL divergence rule (the GPU's figures against two CPU runs): each figure's standard error as llama-perplexity
# prints it (None: none printed), and its value for a model identical to the base (the distance from it is the
# quantization's effect). docs/models.md states RULE word for word.
FIGURES = {"kld_mean": ("kld_mean_err", 0.0), "kld_99_9": (None, 0.0), "kld_99": (None, 0.0),
           "same_top_pct": ("same_top_err", 100.0), "ppl_ratio": ("ppl_ratio_err", 1.0)}
SHARE = 0.10  # of the CPU's distance from that value
RULE = ("every GPU figure (mean KLD, 99.9 % and 99 % KLD, same-top-token %, PPL(Q)/PPL(base)) lies within "
        "max(2 × |CPU_a − CPU_b|, 2 × its standard error as llama-perplexity prints it, 10 % of the CPU's distance "
        "from a model identical to the base) of the two CPU runs' mean; two CPU runs often agree to the last digit, "
        "so the spread alone would demand bit-equality, a difference below the figure's own standard error is not "
        "resolved by the corpus, and GPU kernels that round differently may move the quantization's effect by a "
        "tenth")


def kld_verdict(runs: list[dict]) -> dict:
    """RULE over the first two CPU runs and every GPU run; pass is None without a GPU run."""
    cpu = [r for r in runs if r["device"] == "cpu"][:2]
    if len(cpu) < 2:
        raise SystemExit(f"gpu-kld.json: the rule needs two CPU runs, got {len(cpu)}")
    checks = []
    for g in (r for r in runs if r["device"] == "gpu"):
        for fig, (err_key, ideal) in FIGURES.items():
            a, b, x = cpu[0][fig], cpu[1][fig], g[fig]
            if None in (a, b, x):
                checks.append({"run": g["label"], "figure": fig, "ok": False, "why": "missing in the output"})
                continue
            errs = [e for e in (cpu[0].get(err_key), cpu[1].get(err_key)) if err_key and e is not None]
            mean = (a + b) / 2
            tolerance = max(2 * abs(a - b), 2 * max(errs, default=0.0), SHARE * abs(mean - ideal))
            checks.append({"run": g["label"], "figure": fig, "ok": abs(x - mean) <= tolerance})
    return {"rule": RULE, "pass": all(c["ok"] for c in checks) if checks else None, "checks": checks}


def kld_evidence(status: str, text: str, result: dict) -> tuple[str, str]:
    """The llama row with python -m lab.runs.gpu_kld's result: "verified on GPU" when the tiny preset passed and every GPU
    figure is within the CPU runs' noise (kld.RULE, recomputed here from the runs)."""
    verdict = kld_verdict(result["runs"])
    cpu = [r for r in result["runs"] if r["device"] == "cpu"][:2]
    gpu = next((r for r in result["runs"] if r["device"] == "gpu"), None)
    name = result["model"].removesuffix(".gguf")
    head = (f"; KL divergence of `{name}` vs its F32 upcast over {result['base']['corpus_tokens_used']} corpus tokens "
            f"(`python -m lab.runs.gpu_kld`): CPU mean KLD {cpu[0]['kld_mean']:.5f}/{cpu[1]['kld_mean']:.5f} "
            f"({cpu[0]['threads']}/{cpu[1]['threads']} threads), same top token {cpu[0]['same_top_pct']:.2f}/"
            f"{cpu[1]['same_top_pct']:.2f} %")
    if gpu is None or verdict["pass"] is None:
        return status, text + head + ", no GPU run yet"
    head += (f"; GPU mean KLD {gpu['kld_mean']:.5f}, 99.9 % KLD {gpu['kld_99_9']:.4f}, same top token "
             f"{gpu['same_top_pct']:.2f} %, PPL(Q)/PPL(base) {gpu['ppl_ratio']:.4f}")
    if not verdict["pass"]:
        failed = ", ".join(c["figure"] for c in verdict["checks"] if not c["ok"])
        return "verified on CPU only", text + head + f": outside the CPU's noise ({failed})"
    return status, text + head + ": within the CPU's noise"


def real_weights(status: str, text: str, real: dict, kld: dict | None = None) -> tuple[str, str]:
    """The llama row's real-weight evidence (gpu-check --real-model): it must pass too for "verified on GPU",
    unless a KLD result (python -m lab.runs.gpu_kld) exists: then greedy tokens may part by rounding and the KLD decides."""
    n = real.get("n_predict", 64)
    nmse = real.get("logits_nmse")
    figures = f"logits NMSE {nmse:.1e}" if nmse is not None else "no in-process result"
    name = real["model"].removesuffix(".gguf")
    if real["pass_server"] and real["pass_in_process"]:
        same = real["server_tokens_equal"] and real.get("in_process_tokens_equal")
        tokens = f"{n}/{n} tokens GPU = CPU (server and in-process)" if same else (
            f"tokens part at token {real.get('first_difference', 0) + 1} of {n} by rounding")
        return status, f"{text}; real weights, `{name}`: {tokens}, {figures}"
    part = f"tokens part at token {real['first_difference'] + 1} of {n}, " if "first_difference" in real else ""
    if kld is not None:
        return status, f"{text}; real weights, `{name}`: {part}{figures} (> 1e-4: not token-exact, so by KL divergence)"
    return "verified on CPU only", f"{text}; but real weights, `{name}`, differ on the GPU: {part}{figures} > 1e-4"


def table(results: Path = RESULTS) -> str:
    steps, presets, dates = load_runs(results)
    serving = None  # every soak file (gpu-serving*.json: one per run), cases and NMSE rows together
    for path in sorted(results.glob("gpu-serving*.json")):
        data = json.loads(path.read_text())
        serving = serving or {"cases": [], "nmse": []}
        serving["cases"] += data.get("cases", [])
        serving["nmse"] += data.get("nmse", [])
    archs = known_architectures()
    kld = json.loads((results / "gpu-kld.json").read_text()) if (results / "gpu-kld.json").is_file() else None
    gpu = "no GPU run"
    env = steps.get("environment", {}).get("result")
    if env:
        gpu = f"{env['gpus'][0]['name']} (compute capability {env['gpus'][0]['compute_capability']}, sm_80 code via PTX JIT)"
    lines = [
        f"Generated by `python -m lab.tools.render_compat` from `python -m lab.runs.gpu_check` results ({', '.join(sorted({d[:10] for d in dates})) or 'none'}; "
        f"{gpu}). Pass: temperature-0 tokens equal to the CPU's, or teacher-forced logits NMSE ≤ 1e-4. "
        "Serving soak (`lab/results/gpu-serving*.json`): prompts of every length 1..64 alone, then 1/2/4/8/16/32 "
        "concurrent requests (mixed lengths, streamed and not) per weight type and `--parallel` setting.",
        "",
        "| model family | GGUF architecture | status on the sm_80 build | evidence | serving soak on the GPU | tool calls / reasoning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for family, arch, preset in FAMILIES:
        if archs is not None and arch not in archs:
            status, text = "unsupported", f"this build's llama.cpp does not know `{arch}`"
        else:
            status, text = evidence(preset, presets.get(preset))
        if arch == "llama" and "real model" in steps and steps["real model"]["result"].get("gpu_side_on_gpu"):
            gpu_kld = kld if kld and any(r["device"] == "gpu" for r in kld["runs"]) else None
            status, text = real_weights(status, text, steps["real model"]["result"], gpu_kld)
        if arch == "llama" and kld is not None:
            status, text = kld_evidence(status, text, kld)
        if arch == "deepseek4" and status == "verified on GPU" and "two-gpu" in steps:
            real = steps["two-gpu"]["result"]
            speed = (real.get("timings") or {}).get("predicted_per_second")
            text += (f"; real shape cut to {real['model']['layers']} layers ({real['model']['bytes'] / 1e9:.1f} GB) served "
                     f"with `--tensor-split {real['tensor_split']}`: {'/'.join(real['offloaded'][0])} layers on GPU"
                     + (f", {speed:.0f} tokens/s decode" if speed else ""))
        if arch == "glm-dsa" and status == "verified on GPU" and "glm5" in steps:
            g = steps["glm5"]["result"]
            used = "/".join(f"{m / 1024:.1f}" for m in g["memory_used_by_server_mib"])
            answered = all(a["status"] == 200 for a in g["field_requests"].values())
            text += (f"; real shape cut to {g['model']['layers']} layers × {g['model']['experts']} experts "
                     f"({g['model']['bytes'] / 1e9:.1f} GB) served with `--tensor-split {g['tensor_split']}` at "
                     f"{g['ctx_size']} context × {g['parallel']} slots: {'/'.join(g['offloaded'][0])} layers on GPU, "
                     f"{used} GiB per GPU, the field's two requests {'answered 200' if answered else 'FAILED'}, "
                     f"{g['speed']['p512']['decode_tps']:.0f} tokens/s decode "
                     f"({g['roofline']['fraction_of_ceiling'] * 100:.0f} % of the HBM ceiling)")
        archs_run = [r for r in (steps.get("test-llama-archs") or {}).get("result", {}).get("rows", []) if r["arch"] == arch]
        if archs_run:
            worst = max((r["nmse"] for r in archs_run if r["nmse"] is not None), default=None)
            verdict = "OK" if all(r["status"] == "OK" for r in archs_run) else "FAIL"
            rc = steps["test-llama-archs"]["result"].get("summaries", {}).get(arch, {}).get("rc")
            text += (f"; llama.cpp's own `test-llama-archs` model on {archs_run[0]['device']}: {verdict}"
                     + (f", NMSE {worst:.1e} vs its CPU" if worst is not None else "")
                     + (f", but the process then exited {rc} (SIGABRT at exit; not reproduced on one H200: "
                        "lab/notes/gpu-state.md)" if rc else ""))
        lines.append(f"| {family} | `{arch}` | {status} | {text} | {serving_text(serving, preset, arch)} | {tools_text(arch)} |")
    return "\n".join(lines) + "\n"


def status_table(full: str) -> str:
    """The README's short table: family, architecture, status, tool-call markup (the evidence stays in docs/models.md)."""
    lines = ["| model family | GGUF architecture | on the sm_80 build | tool calls |", "| --- | --- | --- | --- |"]
    for row in full.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
        if len(cells) == 6 and cells[1].startswith("`"):
            lines.append(f"| {cells[0]} | {cells[1]} | {cells[2]} | {cells[5].split(' (')[0]} |")
    return "\n".join(lines) + "\n\nEvidence per family (GPU against CPU, serving soak, KL divergence): [docs/models.md](docs/models.md).\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of gpu-check*.json files")
    parser.add_argument("--print", action="store_true", help="print the full table instead of writing the documents")
    args = parser.parse_args()
    use_installed_build()  # the checkout's package (python -m from the root) on the installed build: its architectures
    full = table(args.results)
    if args.print:
        print(full, end="")
        return 0
    targets = {MODELS_DOC: [((BEGIN, END), full)], SERVING_DOC: [(THINKING, thinking_table())],
               README: [(STATUS, status_table(full))]}
    for path, tables in targets.items():
        text = path.read_text()
        new = text
        for (begin, end), body in tables:
            if begin not in new or end not in new:
                print(f"error: {path} has no {begin} ... {end} markers: add them where the table belongs", file=sys.stderr)
                return 1
            head, rest = new.split(begin, 1)
            _, tail = rest.split(end, 1)
            new = f"{head}{begin}\n{body}{end}{tail}"
        if args.check:
            if new != text:
                print(f"error: {path.relative_to(REPO)}'s compatibility or thinking table is not what the results and "
                      "pyllm_a100/synth/chat.py give: run python -m lab.tools.render_compat", file=sys.stderr)
                return 1
            continue
        path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
