"""Torchrun parity for the parallel MegatronEngine: launch tests/dist/parallel_parity.py on 2 processes (gloo,
CPU) and compare every rank with the same scenario run in one process (world 1)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]  # the repository
SCRIPT = ROOT / "tests" / "dist" / "parallel_parity.py"

# Tolerances: 3x the largest difference measured over TP=2, DP=2 and PP=2 (float32; the parallel runs only
# reorder float sums): logprobs 1.43e-6 nats, loss 2.3e-9 (|loss| ~ 2e-2), grad norm 4.3e-7 relative, weights
# 1.18e-6 absolute after 3 AdamW steps that move them by ~3e-4 (docs/guides/scale-path.md quotes these).
LP_ATOL, LOSS_ATOL, NORM_RTOL, W_ATOL = 4.5e-6, 7e-9, 1.3e-6, 3.6e-6


def load_parity_script():
    """tests/dist/parallel_parity.py as a module (its ``run_parity(model_dir)`` is the single-process run)."""
    spec = importlib.util.spec_from_file_location("parallel_parity", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def torchrun_parity(model_dir: Path, out: Path, tp: int = 1, pp: int = 1) -> list[dict]:
    """Run the parity script under ``torchrun --nproc-per-node 2`` (gloo, CPU; 240 s at most) with tensor
    parallel ``tp`` and pipeline parallel ``pp`` (data parallel fills the rest); each rank's results dict."""
    from areal_cli.foundations.ports import free_port as find_free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(find_free_port()), str(SCRIPT), "--model-dir", str(model_dir), "--out", str(out),
           "--tp", str(tp), "--pp", str(pp)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


def check_parity(ranks: list[dict], ref: dict, out: Path, model_dir: Path) -> None:
    """Assert both ranks match the single-process run ``ref`` within the tolerances above (logprobs before and
    after training, losses, grad norms, final HF weights), match each other exactly, and that rank 0 alone
    wrote the ``saved`` HF directory under ``out``."""
    initial = load_file(str(model_dir / "model.safetensors"))
    assert all(ref["grad_norms"][i] > 0 for i in range(3)) and ref["grad_norms"][0] > 0.1  # step 1 is clipped
    for res in ranks:
        # load_hf shards, hf_state_dict gathers: bit for bit the file's tensors
        assert res["hf_loaded"].keys() == initial.keys()
        assert all(torch.equal(res["hf_loaded"][k], initial[k]) for k in initial)
        assert (res["logprobs0"] - ref["logprobs0"]).abs().max().item() <= LP_ATOL
        assert (res["logprobs"] - ref["logprobs"]).abs().max().item() <= LP_ATOL
        assert res["losses"] == pytest.approx(ref["losses"], rel=0, abs=LOSS_ATOL)
        assert res["grad_norms"] == pytest.approx(ref["grad_norms"], rel=NORM_RTOL)
        assert res["hf"].keys() == ref["hf"].keys()
        moved = max((ref["hf"][k] - initial[k]).abs().max().item() for k in initial)
        assert moved > 10 * W_ATOL
        assert max((res["hf"][k] - ref["hf"][k]).abs().max().item() for k in ref["hf"]) <= W_ATOL
        # the KL reference: the initial weights' logprobs after training, the trained weights back after it
        assert (res["ref_logprobs"] - ref["logprobs0"]).abs().max().item() <= LP_ATOL
        assert torch.equal(res["logprobs_after_ref"], res["logprobs"])
        if "critic_values" in res:  # the critic (not under pipeline parallelism)
            assert float(res["critic_values0"].abs().max()) == 0.0  # the zero value head
            assert (res["critic_values"] - ref["critic_values"]).abs().max().item() <= LP_ATOL
            assert res["critic_losses"] == pytest.approx(ref["critic_losses"], rel=NORM_RTOL, abs=LOSS_ATOL)
            assert res["critic_norms"] == pytest.approx(ref["critic_norms"], rel=NORM_RTOL)
    if "critic_values" in ref:
        assert ref["critic_losses"][-1] < ref["critic_losses"][0] and float(ref["critic_values"].abs().max()) > 1e-3
    a, b = ranks
    assert torch.equal(a["logprobs"], b["logprobs"]) and a["losses"] == b["losses"]
    assert a["grad_norms"] == b["grad_norms"]
    assert all(torch.equal(a["hf"][k], b["hf"][k]) for k in a["hf"])
    # save_hf: one directory, written by global rank 0, equal to the gathered state dict
    assert sorted(p.name for p in out.iterdir()) == ["rank0.pt", "rank1.pt", "saved"]
    saved = load_file(str(out / "saved" / "model.safetensors"))
    assert saved.keys() == a["hf"].keys() and all(torch.equal(saved[k], a["hf"][k]) for k in saved)
