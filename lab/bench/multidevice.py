"""What lab.runs.gpu_multidevice reads and compares (issue 56 item 2): where llama.cpp put each layer and buffer (its own
log), where the split says they go, and greedy tokens with the top-two log-probabilities at every position.

llama.cpp's model order: the RPC devices first, then the local GPUs (src/llama.cpp, "add RPC servers at the front of
the list to minimize network transfers"), and --tensor-split's parts follow that order; ``--list-devices`` (and so
``pyllm serve``'s device list) prints the local GPUs first. Layer il goes to the device whose cumulative share first
exceeds il / (n_layer + 1), the output layer counting as layer n_layer (memplan.layer_devices). With ``-lv 5`` the
log says it per layer (``load_tensors: layer  12 assigned to device RPC0, is_swa = 0``); with ``-lv 4`` and above the
buffers per device (``load_tensors: RPC0[127.0.0.1:50071] model buffer size = 812.34 MiB``: an RPC buffer is named by
the worker's own device index and its endpoint, so the endpoint says which worker; ``llama_kv_cache: CUDA0 KV buffer
size``, DeepSeek-V4's compressor states ``llama_dsv4_comp_state: ... DSV4 csa state buffer size`` count as KV).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import httpx

LAYER = re.compile(r"load_tensors: layer +(\d+) assigned to device ([\w.-]+)")
BUFFER = re.compile(r"(?<![\w\[])(\w+)(?:\[([^\]\s]+)\])? +(model|KV|compute|output|DSV4 \w+ state) buffer size = +([\d.]+) MiB")
KINDS = {"model": "model", "KV": "kv", "compute": "compute", "output": "output"}  # "DSV4 x state" -> kv


def model_order(endpoints: Sequence[str], local: Sequence[str]) -> list[str]:
    """llama.cpp's device names in its model order: RPC0.. (one per endpoint, in --rpc order), then the local GPUs."""
    return [f"RPC{i}" for i in range(len(endpoints))] + list(local)


def layer_assignment(log_text: str, n_layer: int) -> dict[str, Any]:
    """Each device's trunk layers and the output layer's device, from the last assignment logged per layer (a --fit
    pass may log them once before the load)."""
    where: dict[int, str] = {}
    for m in LAYER.finditer(log_text or ""):
        where[int(m[1])] = m[2]
    counts: dict[str, int] = {}
    for il in range(n_layer):
        if il in where:
            counts[where[il]] = counts.get(where[il], 0) + 1
    return {"layers": counts, "output": where.get(n_layer), "logged": len(where) == n_layer + 1}


def planned(n_layer: int, order: Sequence[str], split: Sequence[float] | None = None) -> dict[str, Any]:
    """What the split asks, by device name in llama.cpp's model order (memplan.layer_devices)."""
    from pyllm_a100.planning.memplan import layer_devices

    where = layer_devices(n_layer, len(order), list(split) if split else None)
    counts = {name: 0 for name in order}
    for il in range(n_layer):
        counts[order[where[il]]] += 1
    return {"layers": counts, "output": order[where[-1]]}


def buffers(log_text: str, endpoints: Sequence[str]) -> dict[str, dict[str, float]]:
    """MiB per device and kind (model, kv, compute, output) from the log; an RPC buffer goes to the device of its
    endpoint (RPC<i> for the i-th --rpc endpoint), CPU_Mapped counts as CPU. KV lines and model lines are summed;
    a compute line replaces the one before (a second reserve)."""
    names = {ep: f"RPC{i}" for i, ep in enumerate(endpoints)}
    out: dict[str, dict[str, float]] = {}
    for m in BUFFER.finditer(log_text or ""):
        device, endpoint, kind, mib = m[1], m[2], KINDS.get(m[3], "kv"), float(m[4])
        device = names.get(endpoint, f"{device}[{endpoint}]") if endpoint else ("CPU" if device == "CPU_Mapped" else device)
        slot = out.setdefault(device, {"model": 0.0, "kv": 0.0, "compute": 0.0, "output": 0.0})
        slot[kind] = mib if kind == "compute" else round(slot[kind] + mib, 2)
    return out


def greedy_top2(url: str, prompt: list[int], n: int, api_key: str | None = None,
                timeout: float = 600) -> tuple[list[int], list[tuple[float, float]]]:
    """Temperature-0 token ids and, at every position, the top two log-probabilities (``n_probs`` 2)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "n_probs": 2, "return_tokens": True,
            "ignore_eos": True, "cache_prompt": False, "seed": 42}
    r = httpx.post(f"{url}/completion", json=body, headers=headers, timeout=timeout)
    r.raise_for_status()
    data = r.json()
    top2 = []
    for pos in data.get("completion_probabilities") or []:
        lps = sorted((float(t["logprob"]) for t in pos.get("top_logprobs") or []), reverse=True) + [float("-inf")] * 2
        top2.append((lps[0], lps[1]))
    return list(data["tokens"]), top2


def compare(ref: Sequence[Sequence[int]], got: Sequence[Sequence[int]], ref_top2: Sequence[Sequence[Sequence[float]]],
            got_top2: Sequence[Sequence[Sequence[float]]] | None, tie: float) -> dict[str, Any]:
    """Per prompt: equal, or the first position where the tokens part and the top-two gap there (the reference's and,
    when known, this run's); ``near_tie`` when every parting is at a gap of at most ``tie`` (nats) in the reference."""
    prompts = []
    for i, (a, b) in enumerate(zip(ref, got)):
        first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        entry: dict[str, Any] = {"equal": first is None, "first_difference": first}
        if first is not None:
            gaps = [t[i][first] if t is not None and i < len(t) and first < len(t[i]) else None for t in (ref_top2, got_top2)]
            entry["gap_ref"], entry["gap_here"] = (round(g[0] - g[1], 5) if g and g[1] > float("-inf") else None
                                                   for g in gaps)
            entry["near_tie"] = entry["gap_ref"] is not None and entry["gap_ref"] <= tie
        prompts.append(entry)
    same = bool(prompts) and len(ref) == len(got) and all(p["equal"] for p in prompts)
    return {"same_tokens": same, "near_tie": None if same else all(p.get("near_tie", True) for p in prompts),
            "prompts": prompts, "tie_nats": tie}


def parse_range(text: str, option: str) -> list[int]:
    """``"1-64"`` / ``"1,5,12"`` / ``"1-4,12"`` -> the numbers, in the order given, each at least 1."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"{option} {text!r}: give numbers and ranges, e.g. 1-64 or 1,12,16")
        out += list(range(int(lo), int(hi or lo) + 1))
    if not out or min(out) < 1:
        raise ValueError(f"{option} {text!r}: every value must be at least 1")
    return out
