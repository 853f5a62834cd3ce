"""benchmarks/gpu_check.sh, the offline GPU check, dry-run on the CPU: packing the wheels (megatron-core for
CPython 3.10-3.13 and areal's own, under 60 MB), installing them aside with no index, and running the same
checks (HF vs Megatron in float32 and bf16, decoupled-PPO steps through the trainer, the embedded engine)
on a tiny Qwen3. What it cannot show is CUDA itself; the GPU figures come from running it on a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))


def _sh(*args, timeout=300, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **env})


@pytest.mark.multiproc
@pytest.mark.slow
def test_pack_then_dry_run_installs_the_wheels_aside_and_passes_every_gate(tmp_path):
    wheels = tmp_path / "wheels"
    r = _sh("pack", str(wheels))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    names = sorted(p.name for p in wheels.glob("*.whl"))
    assert [n.split("-")[0] for n in names] == ["areal_cli"] + ["megatron_core"] * 4
    assert {n.split("-")[2] for n in names if n.startswith("megatron")} == {"cp310", "cp311", "cp312", "cp313"}
    assert sum(p.stat().st_size for p in wheels.glob("*.whl")) < 60e6
    assert (wheels / "SHA256SUMS").read_text().count(".whl") == 5

    out = tmp_path / "check"
    r = _sh("run", str(wheels), "--dry-run", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "gpu_check.json").read_text())
    assert res["ok"] and res["dry_run"] and all(res["gates"].values()) and not res["errors"]
    # the code under test came from the packed wheels, not from this checkout
    for where in res["imported_from"].values():
        assert not where.startswith(str(ROOT)) and "areal-gpu-check." in where
    assert res["parity_fp32"]["max_abs_logit"] < 1e-5  # same kernels on the CPU
    # bf16 on the CPU: HF and Megatron now run the same attention kernel (SDPA), so 0 is a valid outcome
    assert 0 <= res["parity_bf16"]["mean_abs_logprob"] < 0.01
    # ... so the proof that bf16 really ran is the dtype Megatron's parameters and logits had
    assert res["parity_bf16"]["dtypes"] == {"megatron_params": "bfloat16", "megatron_logits": "bfloat16"}
    assert res["parity_fp32"]["dtypes"] == {"megatron_params": "float32", "megatron_logits": "float32"}
    ppo = res["ppo_step"]
    assert ppo["ok"] and ppo["max_weight_change"] > 0 and len(ppo["step_s_all"]) == 3
    assert ppo["mfu"] is None  # no peak FLOP/s for a CPU
    assert res["engine"]["fp32_max_abs_logit_vs_hf"] < 1e-5 and res["engine"]["generated_tokens"] == 4 * 8
    assert res["cpu_adaptations_applied"]  # on the CPU they are needed; on a GPU the gate requires none
    assert "all gates passed" in r.stdout and "GPU check on cpu" in r.stdout


@pytest.mark.multiproc
def test_run_without_packed_wheels_or_with_a_tampered_wheel_is_one_line(tmp_path):
    r = _sh("run", str(tmp_path / "nowhere"), "--dry-run")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no packed wheels" in r.stderr
    d = tmp_path / "w"
    d.mkdir()
    (d / "x.whl").write_bytes(b"one")
    subprocess.run("sha256sum ./x.whl > SHA256SUMS", shell=True, cwd=d, check=True)
    (d / "x.whl").write_bytes(b"two")
    r = _sh("run", str(d), "--dry-run")
    assert r.returncode == 2 and "does not match SHA256SUMS" in r.stderr and "Traceback" not in r.stderr
    r = _sh("bogus")
    assert r.returncode == 2 and "usage:" in r.stderr


@pytest.mark.multiproc
def test_without_a_gpu_the_check_refuses_unless_dry_run(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no CUDA device" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_model_flops_match_qwen3_0_6b_published_size():
    """Qwen3-0.6B's model card: 0.44B non-embedding parameters, 0.6B in all (tied embeddings)."""
    import gpu_check

    s = gpu_check.QWEN3_0_6B
    f = gpu_check.model_flops_per_token(s, seq_len=0)
    n = f / 6
    non_embedding = n - s["hidden_size"] * s["vocab_size"]
    assert round(non_embedding / 1e9, 2) == 0.44
    assert round(n / 1e9, 1) == 0.6
    # attention term (PaLM appendix B): 12 * layers * heads * head_dim * T
    assert gpu_check.model_flops_per_token(s, 1024) - f == 12 * 28 * 16 * 128 * 1024
