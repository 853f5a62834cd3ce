"""benchmarks/gpu_smoke.py rehearsed on CPU: the same orchestration (SGLang launch command, Megatron trainer,
async steps, collective weight sync, logprob agreement check) with tests/fake_sglang standing in for SGLang.
What this cannot show is SGLang's own kernels on a GPU; the script's thresholds are for that run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc  # every test here starts processes

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_smoke_script_rehearsal_trains_syncs_over_the_group_and_checks_agreement(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "fake_sglang")}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py"), "--cpu-rehearsal", "--steps", "2",
                        "--weight-update-mode", "xccl", "--out", str(tmp_path / "smoke")],
                       env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "smoke" / "gpu_smoke.json").read_text())
    assert res["ok"] and res["rehearsal"] and res["weight_update_mode"] == "xccl"
    assert res["agreement"]["tokens"] > 50 and res["agreement"]["max_abs_diff"] < 1e-4  # CPU: same kernels
    assert set(res["step_times_s"]) == {"train_s", "sync_s", "wait_s"}
    assert "fake sglang" in (tmp_path / "smoke" / "train" / "logs" / "server0.log").read_text()


def test_gpu_smoke_refuses_to_run_without_a_gpu_unless_rehearsing(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py"), "--out", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no CUDA device" in r.stderr and not (tmp_path / "s").exists()
