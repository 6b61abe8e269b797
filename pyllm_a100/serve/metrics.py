"""The supervisor's own figures in Prometheus text format (``pyllm metrics``), read from state.json.

llama-server's ``/metrics`` (``pyllm serve --metrics``) has what llama-server counts: tokens, requests,
KV use. What only the supervisor knows -- restarts, why the last one happened, how long the model took
to load, since when it serves -- is written here, one sample per managed server, labelled by name.
Printed (scrape it with a cron job or node_exporter's textfile collector: ``--output FILE`` replaces
the file atomically) rather than merged into llama-server's endpoint: that endpoint is llama-server's
own HTTP server, and merging would need a proxy in front of every request, or a patched llama.cpp.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .state import ServerEntry

# name, type, help (the _info families: value 1, the facts in labels, node_exporter's convention)
_FAMILIES: list[tuple[str, str, str]] = [
    ("pyllm_server_up", "gauge", "1 while the server is ready (answers /health), else 0"),
    ("pyllm_server_restarts_total", "counter", "Restarts of the child by its pyllm supervisor since the supervisor started"),
    ("pyllm_server_restart_limit", "gauge", "Restarts the supervisor allows (--restart) before it gives up"),
    ("pyllm_server_load_seconds", "gauge", "Seconds the last (re)start took from spawning llama-server to /health 200"),
    ("pyllm_server_ready_since_seconds", "gauge", "Unix time the child last became ready"),
    ("pyllm_supervisor_start_time_seconds", "gauge", "Unix time the pyllm process owning the server started"),
    ("pyllm_server_last_restart_time_seconds", "gauge", "Unix time of the last restart"),
    ("pyllm_server_last_restart_info", "gauge", "1, labelled with why the child was last restarted (the one-line reason)"),
    ("pyllm_server_info", "gauge", "1, labelled with what each managed server serves"),
]


def _label(value: Any) -> str:
    text = " ".join(str(value).split())
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _labels(**labels: Any) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items() if v is not None) + "}"


def _number(value: Any) -> str | None:
    try:
        if value is None:
            return None
        number = float(value)
        return str(int(number)) if number.is_integer() else repr(number)
    except (TypeError, ValueError):
        return None


def exposition(entries: Iterable[ServerEntry]) -> str:
    """Prometheus text format (version 0.0.4) for these entries; every family is declared even when empty."""
    samples: dict[str, list[str]] = {name: [] for name, _, _ in _FAMILIES}
    for e in entries:
        d = e.data
        me = _labels(name=e.name)
        samples["pyllm_server_up"].append(f"pyllm_server_up{me} {1 if d.get('status') == 'ready' else 0}")
        samples["pyllm_server_restarts_total"].append(f"pyllm_server_restarts_total{me} {_number(d.get('restarts') or 0)}")
        for family, key in (("pyllm_server_restart_limit", "restart_limit"), ("pyllm_server_load_seconds", "load_seconds"),
                            ("pyllm_server_ready_since_seconds", "ready_since"),
                            ("pyllm_supervisor_start_time_seconds", "started_at"),
                            ("pyllm_server_last_restart_time_seconds", "last_restart_at")):
            value = _number(d.get(key))
            if value is not None and not (key == "ready_since" and d.get("status") != "ready"):
                samples[family].append(f"{family}{me} {value}")
        if d.get("last_restart_reason"):
            samples["pyllm_server_last_restart_info"].append(
                f"pyllm_server_last_restart_info{_labels(name=e.name, reason=d['last_restart_reason'])} 1")
        gpus = d.get("gpus") if isinstance(d.get("gpus"), list) else []
        samples["pyllm_server_info"].append("pyllm_server_info" + _labels(
            name=e.name, kind=d.get("kind", "server"), status=d.get("status", "?"), model=d.get("model", ""),
            served_name=d.get("served_name"), url=d.get("url", ""), gpus=",".join(map(str, gpus)),
            service=d.get("service")) + " 1")
    lines: list[str] = []
    for name, kind, text in _FAMILIES:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples[name]]
    return "\n".join(lines) + "\n"


LOAD_SAMPLES = {"llamacpp:requests_processing": "processing", "llamacpp:requests_deferred": "waiting",
                "llamacpp:kv_reserved_tokens": "kv_reserved", "llamacpp:kv_pool_tokens": "kv_pool"}


def server_load(entry: ServerEntry, timeout: float = 2.0) -> dict[str, int] | None:
    """What a ready server's llama-server says of its load now (its /metrics): requests processing and waiting for
    a slot or KV space, KV tokens reserved of the pool. None when it has no /metrics or does not answer in time."""
    import httpx

    url, key_file = entry.data.get("metrics"), entry.data.get("api_key_file")
    if not url or entry.data.get("status") != "ready":
        return None
    headers = {}
    try:
        if key_file:
            headers["Authorization"] = "Bearer " + open(key_file).read().split()[0]
        text = httpx.get(url, headers=headers, timeout=timeout).text
    except (OSError, IndexError, httpx.HTTPError):
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in LOAD_SAMPLES:
            try:
                out[LOAD_SAMPLES[name]] = int(float(value))
            except ValueError:
                continue
    return out or None
