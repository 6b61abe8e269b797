"""pyllm serve --gpus 0-3: the parser, the checks against NVML, the child's environment, ps, overlaps."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from conftest import run_pyllm
from fake_gpus import fake_gpu_env

from pyllm_a100.devices.gpus import GPU, child_env, format_gpu_list, parse_gpu_list, select_gpus
from pyllm_a100.errors import EX_CONFIG, GpuSelectionError


@pytest.mark.parametrize("text, expected", [
    ("0-3", [0, 1, 2, 3]), ("4-7", [4, 5, 6, 7]), ("0,1", [0, 1]), ("2", [2]), (" 0 - 1 , 5 ", [0, 1, 5]),
    ("3,1", [3, 1]), ("0-1,4-5", [0, 1, 4, 5]), ("7-7", [7]),
])
def test_gpu_lists_parse(text: str, expected: list[int]) -> None:
    assert parse_gpu_list(text) == expected
    assert parse_gpu_list(format_gpu_list(expected)) == expected


@pytest.mark.parametrize("text, says", [
    ("", "--gpus is empty"), ("  ", "--gpus is empty"), ("a", "'a' is not a GPU number or a range N-M"),
    ("0-", "'0-' is not a GPU number"), ("-1", "'-1' is not a GPU number"), ("0,,1", "'' is not a GPU number"),
    ("3-0", "the range 3-0 runs backwards; write 0-3"), ("0,0", "GPU 0 is named twice"), ("0-3,2", "GPU 2 is named twice"),
    ("8x80", "COUNTxGIB is pyllm doctor's memory-plan form"), ("1.5", "'1.5' is not a GPU number"),
])
def test_bad_gpu_lists_are_one_line(text: str, says: str) -> None:
    with pytest.raises(GpuSelectionError) as caught:
        parse_gpu_list(text)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def _gpus(n: int) -> list[GPU]:
    return [GPU(i, i, "NVIDIA A100-SXM4-80GB", f"GPU-{i}", "8.0", 80 * 2**30, 79 * 2**30, False) for i in range(n)]


def test_selection_is_checked_against_what_nvml_sees() -> None:
    assert [g.physical_index for g in select_gpus("4-7", _gpus(8), environ={})] == [4, 5, 6, 7]
    with pytest.raises(GpuSelectionError, match=r"--gpus 6-9: no GPU 8-9 on this machine \(NVML sees 8: 0-7\)"):
        select_gpus("6-9", _gpus(8), environ={})
    with pytest.raises(GpuSelectionError, match="NVML sees no NVIDIA GPU on this machine"):
        select_gpus("0", [], environ={})
    with pytest.raises(GpuSelectionError, match=r"GPU 5 is hidden by CUDA_VISIBLE_DEVICES=0,1 in this environment \(visible: 0-1\)"):
        select_gpus("1,5", _gpus(8), environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert [g.physical_index for g in select_gpus("4", _gpus(8), environ={"CUDA_VISIBLE_DEVICES": "4,5"})] == [4]


def test_child_env_is_a_copy() -> None:
    base = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}
    env = child_env([4, 5], base)
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert base == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}


def test_gpus_on_a_machine_without_gpus_is_one_line(tiny_deepseek4: Path) -> None:
    from pyllm_a100.devices.gpus import nvml_gpus

    if nvml_gpus():
        pytest.skip("this machine has NVIDIA GPUs")
    result = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--gpus", "0", timeout=60)
    assert result.returncode == EX_CONFIG, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: --gpus 0: NVML sees no NVIDIA GPU on this machine (no driver, or no GPU): check nvidia-smi, "
        "or leave --gpus out to run on the CPU"]
    syntax = run_pyllm("serve", str(tiny_deepseek4), "--gpus", "0-3,2", timeout=60)
    assert syntax.returncode == EX_CONFIG and syntax.stderr.count("\n") == 1 and "GPU 2 is named twice" in syntax.stderr


def test_gpus_with_a_cpu_build_is_one_line(tiny_deepseek4: Path, info: dict, tmp_path: Path) -> None:
    if info["cuda"]:
        pytest.skip("this build has CUDA")
    env = fake_gpu_env(tmp_path / "fake", 8, cuda_build=False)
    result = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--gpus", "0-3", env=env, timeout=60)
    assert result.returncode == EX_CONFIG and result.stderr.count("\n") == 1, result.stderr
    assert "--gpus 0-3: this llama.cpp build has no CUDA (CPU only)" in result.stderr


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_gpus_reach_the_child_state_and_ps(tiny_deepseek4: Path, tmp_path: Path) -> None:
    """On a machine NVML says has 4 A100s: llama-server gets CUDA_VISIBLE_DEVICES, pyllm does not; ps shows the set;
    an overlapping second server is warned about; --tensor-split is counted against the chosen GPUs."""
    env = fake_gpu_env(tmp_path / "fake", 4)
    try:
        first = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--gpus", "0-1", "--detach", "--name", "a", env=env, timeout=300)
        assert first.returncode == 0, first.stderr
        assert "GPUs 0-1" in first.stderr and "warning" not in first.stderr
        (a,) = json.loads(run_pyllm("ps", "--json", env=env, check=True).stdout)
        assert a["gpus"] == [0, 1] and a["gpus_given"] is True
        child = _environ(a["server_pid"])
        assert child["CUDA_VISIBLE_DEVICES"] == "0,1" and child["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "CUDA_VISIBLE_DEVICES" not in _environ(a["supervisor_pid"]), "the supervisor's own environment is left alone"
        assert psutil.Process(a["server_pid"]).name() == "llama-server"

        second = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--gpus", "1-3", "--detach", "--name", "b", env=env, timeout=300)
        assert second.returncode == 0, second.stderr
        assert "warning: GPU 1 also used by a (pyllm ps)" in second.stderr, second.stderr
        ps = run_pyllm("ps", env=env, check=True).stdout
        rows = {line.split()[0]: line.split() for line in ps.splitlines()[1:] if line and not line.startswith(" ")}
        assert rows["a"][6] == "0-1" and rows["b"][6] == "1-3", ps

        split = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--gpus", "2-3", "--tensor-split", "1x3", env=env, timeout=60)
        assert split.returncode == EX_CONFIG and split.stderr.count("\n") == 1, split.stderr
        assert "--tensor-split 1x3 has 3 parts but --gpus 2-3 chose 2 GPU(s): use 1x2" in split.stderr
        missing = run_pyllm("serve", str(tiny_deepseek4), "--port", "0", "--gpus", "3-4", env=env, timeout=60)
        assert missing.returncode == EX_CONFIG and "no GPU 4 on this machine (NVML sees 4: 0-3)" in missing.stderr
    finally:
        run_pyllm("stop", "--all", env=env, timeout=120)


def test_doctor_plans_for_a_device_list_or_a_count(tmp_path: Path) -> None:
    """doctor --gpus keeps COUNTxGIB (GPUs that need not be here) and takes serve's device list (GPUs of this machine)."""
    env = fake_gpu_env(tmp_path / "fake", 8)
    listed = run_pyllm("doctor", "tiny-llama", "--gpus", "4-7", "--json", env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    plan = json.loads(listed.stdout)
    assert plan["gpus"] == {"count": 4, "gib": 80.0, "devices": [4, 5, 6, 7]}
    assert all(r["serve"].endswith(" --gpus 4-7") for r in plan["rows"] if r["serve"])
    text = run_pyllm("doctor", "tiny-llama", "--gpus", "4-7", env=env, timeout=120).stdout
    assert "on 4 x 80 GiB (GPUs 4-7 of this machine)" in text
    counted = json.loads(run_pyllm("doctor", "tiny-llama", "--gpus", "8x80", "--json", check=True).stdout)
    assert counted["gpus"] == {"count": 8, "gib": 80.0, "devices": None}
    missing = run_pyllm("doctor", "tiny-llama", "--gpus", "6-9", env=env, timeout=120)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "no GPU 8-9 on this machine" in missing.stderr
    bad = run_pyllm("doctor", "tiny-llama", "--gpus", "eight", timeout=120)
    assert bad.returncode == 1 and "write COUNTxGIB" in bad.stderr and "or GPU numbers of this machine (0-3)" in bad.stderr
