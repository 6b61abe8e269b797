"""pyllm serve --metrics (llama-server's /metrics, behind the API key) and pyllm metrics (the supervisor's figures),
both scraped with Prometheus's own text-format parser against a real detached server of a tiny synthetic model."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conftest import run_pyllm, wait_for

KEY = "metrics-test-key-0123456789"


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(families: dict, family: str, suffix: str = "", **labels: str):
    (value,) = [s.value for s in families[family].samples
                if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items())]
    return value


def test_metrics_endpoint_and_supervisor_figures(tiny_deepseek4: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PYLLM_API_KEY=KEY)
    started = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--metrics", "--detach", "--name", "m", env=env, timeout=300)
    assert started.returncode == 0, started.stderr
    try:
        (entry,) = json.loads(run_pyllm("ps", "--json", check=True).stdout)
        url = f"http://127.0.0.1:{entry['port']}"
        assert entry["metrics"] == f"{entry['url']}/metrics"
        assert f"metrics: {entry['url']}/metrics (llama-server; send the API key)" in run_pyllm("ps", check=True).stdout

        # llama-server's endpoint: on (--metrics), and behind the key like every route but /health
        assert httpx.get(url + "/metrics", timeout=10).status_code == 401
        assert httpx.get(url + "/metrics", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
        answer = httpx.post(url + "/completion", json={"prompt": "Hello", "n_predict": 4},
                            headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
        assert answer.status_code == 200, answer.text
        scraped = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert scraped.status_code == 200
        families = _families(scraped.text)
        assert families["llamacpp:tokens_predicted"].type == "counter"
        assert _sample(families, "llamacpp:tokens_predicted", "_total") >= 1
        assert "llamacpp:requests_processing" in families

        # the supervisor's figures, before and after llama-server is killed and restarted
        ours = _families(run_pyllm("metrics", "m", check=True).stdout)
        assert _sample(ours, "pyllm_server_up", name="m") == 1
        assert _sample(ours, "pyllm_server_restarts", "_total", name="m") == 0
        assert 0 < _sample(ours, "pyllm_server_load_seconds", name="m") < 300
        assert _sample(ours, "pyllm_server_restart_limit", name="m") == 3
        assert ours["pyllm_server_last_restart_info"].samples == []
        ready_since = _sample(ours, "pyllm_server_ready_since_seconds", name="m")
        assert _sample(ours, "pyllm_supervisor_start_time_seconds", name="m") <= ready_since <= time.time()
        info = [s.labels for s in ours["pyllm_server_info"].samples]
        assert info == [{"name": "m", "kind": "server", "status": "ready", "model": str(tiny_deepseek4),
                         "served_name": tiny_deepseek4.stem, "url": entry["url"], "gpus": ""}]

        os.kill(entry["server_pid"], signal.SIGKILL)
        after = wait_for(lambda: [e for e in json.loads(run_pyllm("ps", "--json", check=True).stdout)
                                  if e.get("restarts") == 1 and e.get("status") == "ready"], 120,
                         "the supervisor to restart the killed server", poll=0.25)[0]
        assert after["server_pid"] != entry["server_pid"]
        out = tmp_path / "textfile" / "pyllm.prom"
        assert run_pyllm("metrics", "--output", str(out), check=True).stdout == ""
        ours = _families(out.read_text())
        assert _sample(ours, "pyllm_server_restarts", "_total", name="m") == 1
        assert _sample(ours, "pyllm_server_up", name="m") == 1
        (reason,) = [s.labels["reason"] for s in ours["pyllm_server_last_restart_info"].samples if s.labels["name"] == "m"]
        assert "SIGKILL" in reason, reason
        assert _sample(ours, "pyllm_server_ready_since_seconds", name="m") > ready_since
        assert _sample(ours, "pyllm_server_last_restart_time_seconds", name="m") <= _sample(ours, "pyllm_server_ready_since_seconds", name="m")
    finally:
        run_pyllm("stop", "--all", timeout=120)
    empty = _families(run_pyllm("metrics", check=True).stdout)
    assert empty["pyllm_server_up"].samples == [] and "pyllm_server_restarts" in empty
    missing = run_pyllm("metrics", "nosuch")
    assert missing.returncode == 1 and "no managed server named 'nosuch'" in missing.stderr
