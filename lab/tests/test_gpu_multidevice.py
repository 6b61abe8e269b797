"""lab.runs.gpu_multidevice end to end on the CPU build (issue 56 item 2's grid, checked before a GPU is lent): real
rpc-workers and llama-servers of the installed package on the tiny DeepSeek-V4, the split over two workers against
the one device, the layers and buffers llama.cpp logged against the split and the product's plan, in-process Llama
over the same workers, a -ub sweep, and the RPC check of patch 0043; plus the parsers on the GPU's log lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.bench import multidevice as md
from lab.tests import fakes


@pytest.fixture(scope="module")
def tiny_v4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pyllm_a100.synth import synthesize

    return synthesize("tiny-deepseek4", tmp_path_factory.mktemp("md") / "tiny-v4.gguf", seed=42).first


def test_two_rpc_workers_serve_the_tiny_v4_as_one_device_does(tiny_v4: Path, tmp_path: Path) -> None:
    work, out = tmp_path / "w", tmp_path / "out"
    env = dict(fakes.env_without_preload(), OUT=str(out))
    result = fakes.program(
        "lab.runs.gpu_multidevice", "--work", str(work), "--models", str(tiny_v4), "--columns", "pyllm", "--devices", "1,2",
        "--ctx-size", "8192", "--parallel", "4", "--gen", "16", "--decode-tokens", "32", "--sweep", "1-16", "--streams", "4",
        "--inprocess-devices", "2", "--ub", "1,3", "--ub-devices", "2", "--ub-sweep", "1-8", "--ub-streams", "2",
        "--server-args=-t 1", "rpccheck", "grid", "inprocess", "ubsweep", env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((out / "gpu-multidevice.json").read_text())
    assert data == json.loads((work / "results" / "gpu-multidevice.json").read_text())
    assert data["commands"][0].startswith("python -m lab.runs.gpu_multidevice --work")
    rows = {(r["kind"], r["devices"], r["ub"]): r for r in data["rows"]}
    assert set(rows) == {("serve", 1, None), ("serve", 2, None), ("inprocess", 2, None), ("ub", 2, 1), ("ub", 2, 3)}
    for r in data["rows"]:  # the fields, and nothing died
        assert {"model", "layers", "devices", "dispatch", "same_tokens", "crashes", "errors", "decode_tps",
                "layers_per_device"} <= set(r)
        assert (r["model"], r["layers"], r["dispatch"], r["crashes"], r["errors"]) == ("tiny-v4", 4, "native", 0, 0), r

    one, two = rows[("serve", 1, None)], rows[("serve", 2, None)]
    assert one["layers_per_device"] == {"CPU": 4} and one["workers"] == 0 and "--rpc" not in one["argv"]
    assert two["same_tokens"] is True and two["reference"] == 1 and two["tokens"] == one["tokens"]
    assert len(two["tokens"]) == 3 and all(len(t) == 16 for t in two["tokens"])
    assert two["decode_tps"] > 0 and one["decode_tps"] > 0
    # the workers really ran: llama-server sent them its layers over RPC, as the split asks and the product plans
    assert two["workers"] == 2 and f"--rpc {','.join(two['endpoints'])}" in two["argv"] and "--tensor-split 1,1" in two["argv"]
    assert all(c.startswith("pyllm rpc-worker --port ") for c in two["worker_commands"])
    assert two["layers_per_device"] == two["planned_layers"] == two["product_plan_layers"] == {"RPC0": 3, "RPC1": 1}
    assert two["output_device"] == two["planned_output"] == "RPC1" and two["layers_as_split"] and two["product_plan_matches"]
    assert set(two["buffers_mib"]) == {"RPC0", "RPC1"} and two["buffers_mib"]["RPC0"]["model"] > two["buffers_mib"]["RPC1"]["model"]
    assert all(abs(v["weights"]) < 5 for v in two["vs_plan_pct"].values()), two["vs_plan_pct"]
    assert "RPC0[127.0.0.1:" in Path(two["log"]).read_text(errors="replace")
    logs = list((work / "md" / "logs").glob("worker-pyllm-*.log"))
    assert logs and all("Accepted client connection" in p.read_text(errors="replace") for p in logs)
    assert two["sweep"] == {"lengths": "1-16", "errors": 0, "first_error": None}
    assert two["streams"]["n"] == 4 and two["streams"]["failures"] == 0 and two["streams"]["requests"] == 4

    inproc = rows[("inprocess", 2, None)]
    assert inproc["same_tokens"] is True and inproc["layers_per_device"] == {"RPC0": 3, "RPC1": 1}
    assert "lab.bench.rpc_inprocess" in inproc["command"] and "--tensor-split 1x2" in inproc["command"]
    assert all(rows[("ub", 2, u)]["sweep"]["errors"] == 0 and f"-ub {u}" in rows[("ub", 2, u)]["argv"] for u in (1, 3))

    check = data["rpccheck"]
    assert check["patch_0043"] is True and check["prepare_execution"]["libggml-rpc.so"] == 0
    runs = check["columns"]["pyllm"]["runs"]
    assert [r["rc"] for r in runs] == [0, 0, 0] and all(r["devices"] == ["RPC0"] for r in runs)
    assert check["columns"]["pyllm"]["ok"] and check["columns"]["pyllm"]["ld_debug"]["once_lines"] > 0


REFUSED = {  # arguments -> what the one-line refusal says
    ("--columns", "pin@a100"): "the package's own build",
    ("--columns", "pyllm@h100"): "DISPATCH one of",
    ("--models", "v9-1l"): "unknown model v9-1l",
    ("--devices", "0,2"): "--devices",
    ("--ub", "1-x"): "--ub",
}


def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path) -> None:
    for args, message in REFUSED.items():
        result = fakes.program("lab.runs.gpu_multidevice", "--work", str(tmp_path), *args, "grid", timeout=60)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)


def test_a_site_without_the_package_is_a_one_line_error(tmp_path: Path) -> None:
    result = fakes.program("lab.runs.gpu_multidevice", "--work", str(tmp_path), "--site", str(tmp_path), "grid", timeout=60)
    assert result.returncode == 1 and "no pyllm_a100/_native there" in result.stderr and "Traceback" not in result.stderr


GPU_LOG = """\
0.01 D load_tensors: layer   0 assigned to device RPC0, is_swa = 0
0.01 D load_tensors: layer   1 assigned to device CUDA0, is_swa = 0
0.02 D load_tensors: layer   0 assigned to device RPC0, is_swa = 0
0.02 D load_tensors: layer   1 assigned to device RPC1, is_swa = 0
0.02 D load_tensors: layer   2 assigned to device CUDA0, is_swa = 0
0.02 D load_tensors: layer   3 assigned to device CUDA0, is_swa = 0
0.03 I load_tensors:   CPU_Mapped model buffer size =   500.00 MiB
0.03 I load_tensors: RPC0[127.0.0.1:50071] model buffer size =   812.34 MiB
0.03 I load_tensors: RPC0[127.0.0.1:50072] model buffer size =   800.00 MiB
0.03 I load_tensors:        CUDA0 model buffer size =  1700.50 MiB
0.04 I llama_kv_cache: RPC0[127.0.0.1:50071] KV buffer size =    10.00 MiB
0.04 I llama_kv_cache:        CUDA0 KV buffer size =    20.00 MiB
0.04 I llama_kv_cache: RPC0[127.0.0.1:50071] KV buffer size =     2.50 MiB
0.04 I llama_dsv4_comp_state: RPC0[127.0.0.1:50072] DSV4 csa state buffer size =     0.25 MiB
0.05 I sched_reserve:        CUDA0 compute buffer size =   300.00 MiB
0.05 I sched_reserve:        CUDA0 compute buffer size =   310.00 MiB
0.05 I llama_context:  CUDA_Host  output buffer size =     0.50 MiB
"""


def test_the_log_is_read_per_device_and_the_split_in_llamas_model_order() -> None:
    got = md.layer_assignment(GPU_LOG, 3)  # the last assignment of each layer wins (a --fit pass logs them first)
    assert got == {"layers": {"RPC0": 1, "RPC1": 1, "CUDA0": 1}, "output": "CUDA0", "logged": True}
    eps = ["127.0.0.1:50071", "127.0.0.1:50072"]
    buffers = md.buffers(GPU_LOG, eps)
    assert buffers["RPC0"] == {"model": 812.34, "kv": 12.5, "compute": 0.0, "output": 0.0}
    assert buffers["RPC1"]["model"] == 800.0 and buffers["RPC1"]["kv"] == 0.25  # a compressor state counts as KV
    assert buffers["CUDA0"]["compute"] == 310.0 and buffers["CPU"]["model"] == 500.0 and buffers["CUDA_Host"]["output"] == 0.5
    order = md.model_order(eps, ["CUDA0"])
    assert order == ["RPC0", "RPC1", "CUDA0"]  # RPC devices first: the local GPU gets the last layers and the output
    assert md.planned(43, ["RPC0", "CUDA0"]) == {"layers": {"RPC0": 22, "CUDA0": 21}, "output": "CUDA0"}
    assert md.planned(43, order)["layers"] == {"RPC0": 15, "RPC1": 15, "CUDA0": 13}
    assert md.parse_range("12,1,16,2-4", "--ub") == [12, 1, 16, 2, 3, 4]


def test_tokens_that_part_at_a_near_tie_are_told_from_a_real_difference() -> None:
    ref = [[1, 2, 3], [4, 5, 6]]
    top2 = [[[-1.0, -3.0], [-2.0, -2.01], [-1.0, -2.0]], [[-1.0, -1.5], [-1.0, -2.0], [-1.0, -2.0]]]
    same = md.compare(ref, [[1, 2, 3], [4, 5, 6]], top2, None, tie=0.02)
    assert same["same_tokens"] is True and same["near_tie"] is None
    tie = md.compare(ref, [[1, 9, 9], [4, 5, 6]], top2, None, tie=0.02)
    assert tie["same_tokens"] is False and tie["near_tie"] is True
    assert tie["prompts"][0] == {"equal": False, "first_difference": 1, "gap_ref": 0.01, "gap_here": None, "near_tie": True}
    real = md.compare(ref, [[1, 2, 3], [7, 5, 6]], top2, None, tie=0.02)
    assert real["near_tie"] is False and real["prompts"][1]["gap_ref"] == 0.5
