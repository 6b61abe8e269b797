"""The agent-team table of docs/performance.md (agents-table markers), from lab/results/cpu-agents.json.

That file is what ``pyllm bench agents MODEL ... --json`` printed, with the command, the date and the machine
added (python -m lab.benchmarks.agents writes it).
"""

from __future__ import annotations

from typing import Any

AGENTS_TABLE = ("<!-- agents-table -->", "<!-- /agents-table -->")


def render(data: dict[str, Any] | None) -> str:
    if not data:
        return "Not measured yet: run python -m lab.benchmarks.agents.\n"
    load = data["load"]
    levels = data["levels"]
    ours = levels[0]["server"]
    base = {r["clients"]: r for r in levels if r["server"] != ours}
    lines = [
        f"{data['model']} on {data['machine']} ({data['date']}): every request shares a {load['system_tokens']:,}-token "
        f"system prompt, adds {load['tail_tokens']} tokens of its own and generates {load['gen_tokens']}; "
        f"{load['requests_per_client']} request(s) per client. `{ours}` (its defaults) against the pin's llama-server "
        f"with `{next(iter(base.values()))['server'].removeprefix('llama.cpp ') if base else '-'}`, one after the other in one run:",
        "",
        f"`{data['command']}`",
        "",
        "| clients | completed (pyllm / baseline) | failed | aggregate tokens/s | TTFT p50 s | TTFT p99 s | prompt reused |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def t(row: dict, key: str) -> str:  # a level where nothing completed has no times
        return f"{row[key]:.2f}" if row["requests"] else "-"

    for r in levels:
        if r["server"] != ours:
            continue
        b = base.get(r["clients"])
        if b is None:
            continue
        lines.append(f"| {r['clients']} | {r['requests']} / {b['requests']} | {r['failures']} / {b['failures']} | "
                     f"{r['aggregate_tps']:.1f} / {b['aggregate_tps']:.1f} | {t(r, 'ttft_p50_s')} / {t(b, 'ttft_p50_s')} | "
                     f"{t(r, 'ttft_p99_s')} / {t(b, 'ttft_p99_s')} | {r['prompt_reused']:.0%} / {b['prompt_reused']:.0%} |")
    first = next((b["first_error"] for b in base.values() if b.get("first_error")), None)
    if first:
        lines += ["", f"The baseline's first failure: {' '.join(str(first).split())[:300]}"]
    return "\n".join(lines) + "\n"
