"""Tensor / pipeline / data parallel MegatronEngine: sharding layouts, torchrun parity with one process.

The parity tests launch ``python -m torch.distributed.run --nproc-per-node 2`` (gloo, CPU) on
tests/dist/parallel_parity.py and compare every rank's results with the same run in this process (world 1):
logprobs before/after training, losses and grad norms of 3 PPO-like steps (step 1 clipped), the final HF
weights, and the HF directory written by ``save_hf`` (global rank 0 only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from areal_cli.errors import UserError
from areal_cli.trainer import hf_mcore
from areal_cli.trainer import parallel_shard as psh
from areal_cli.trainer.collectives import dp_row_ranges
from areal_cli.trainer.megatron_engine import MegatronEngine

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "dist" / "parallel_parity.py"

# Tolerances: 3x the largest difference measured over TP=2, DP=2 and PP=2 (float32; the parallel runs only
# reorder float sums): logprobs 1.43e-6 nats, loss 2.3e-9 (|loss| ~ 2e-2), grad norm 4.3e-7 relative, weights
# 1.18e-6 absolute after 3 AdamW steps that move them by ~3e-4 (README "Scale path" quotes these).
LP_ATOL, LOSS_ATOL, NORM_RTOL, W_ATOL = 4.5e-6, 7e-9, 1.3e-6, 3.6e-6


def _load_script():
    spec = importlib.util.spec_from_file_location("parallel_parity", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """Tiny Qwen3 (GQA 4 query / 2 KV heads, MLP 256) with an ODD vocabulary (301: padded to 302 under TP=2)
    and every weight perturbed."""
    from areal_cli.models.tiny import build_tiny_model

    d = tmp_path_factory.mktemp("parallel_model")
    build_tiny_model(d, vocab_size=301, intermediate_size=256)
    sd = load_file(str(d / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    sd = {k: (v + 0.05 * torch.randn(v.shape, generator=g)).contiguous() for k, v in sorted(sd.items())}
    save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.fixture(scope="module")
def reference(model_dir) -> dict:
    """The single-process run (world 1, TP 1) of the parity script's scenario."""
    return _load_script().run_parity(model_dir)


def _torchrun(model_dir: Path, out: Path, tp: int = 1, pp: int = 1) -> list[dict]:
    from areal_cli.ports import free_port as find_free_port

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(find_free_port()), str(SCRIPT), "--model-dir", str(model_dir), "--out", str(out),
           "--tp", str(tp), "--pp", str(pp)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


def _check_parity(ranks: list[dict], ref: dict, out: Path, model_dir: Path) -> None:
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
    a, b = ranks
    assert torch.equal(a["logprobs"], b["logprobs"]) and a["losses"] == b["losses"]
    assert a["grad_norms"] == b["grad_norms"]
    assert all(torch.equal(a["hf"][k], b["hf"][k]) for k in a["hf"])
    # save_hf: one directory, written by global rank 0, equal to the gathered state dict
    assert sorted(p.name for p in out.iterdir()) == ["rank0.pt", "rank1.pt", "saved"]
    saved = load_file(str(out / "saved" / "model.safetensors"))
    assert saved.keys() == a["hf"].keys() and all(torch.equal(saved[k], a["hf"][k]) for k in saved)


@pytest.mark.slow
def test_tensor_parallel_2_matches_single_process(model_dir, reference, tmp_path):
    ranks = _torchrun(model_dir, tmp_path / "tp2", tp=2)
    assert [(r["tp"], r["pp"], r["dp"], r["world"]) for r in ranks] == [(2, 1, 1, 2)] * 2
    _check_parity(ranks, reference, tmp_path / "tp2", model_dir)


@pytest.mark.slow
def test_data_parallel_2_matches_single_process(model_dir, reference, tmp_path):
    ranks = _torchrun(model_dir, tmp_path / "dp2")
    assert [(r["tp"], r["pp"], r["dp"], r["world"]) for r in ranks] == [(1, 1, 2, 2)] * 2
    _check_parity(ranks, reference, tmp_path / "dp2", model_dir)


@pytest.mark.slow
def test_pipeline_parallel_2_matches_single_process(model_dir, reference, tmp_path):
    """Megatron's forward_backward_pipelining_without_interleaving on CPU (one layer per stage)."""
    ranks = _torchrun(model_dir, tmp_path / "pp2", pp=2)
    assert [(r["tp"], r["pp"], r["dp"], r["world"]) for r in ranks] == [(1, 2, 1, 2)] * 2
    _check_parity(ranks, reference, tmp_path / "pp2", model_dir)


# ----------------------------------------------------------------------------- layouts (in process)


def test_qkv_shard_of_rank_r_is_the_packing_of_its_own_query_groups():
    heads, groups, hd, hidden, tp = 8, 4, 2, 3, 2
    q, k, v = (torch.randn(n * hd, hidden) for n in (heads, groups, groups))
    full = hf_mcore.TRANSFORMS["qkv"][0]([q, k, v], hf_mcore._Dims(heads, groups, hd))
    per_rank_heads, per_rank_groups = heads // tp, groups // tp
    for r in range(tp):
        own = [q[r * per_rank_heads * hd:(r + 1) * per_rank_heads * hd],
               k[r * per_rank_groups * hd:(r + 1) * per_rank_groups * hd],
               v[r * per_rank_groups * hd:(r + 1) * per_rank_groups * hd]]
        expect = hf_mcore.TRANSFORMS["qkv"][0](own, hf_mcore._Dims(per_rank_heads, per_rank_groups, hd))
        assert torch.equal(psh.shard(full, dim=0, stride=1, tp=tp, rank=r), expect)


def test_fc1_shard_is_cat_of_gate_and_up_shards_and_unshard_inverts_every_layout():
    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    fc1 = torch.cat([gate, up])
    parts = [psh.shard(fc1, dim=0, stride=2, tp=2, rank=r) for r in range(2)]
    assert torch.equal(parts[1], torch.cat([gate[3:], up[3:]]))
    assert torch.equal(psh.unshard(parts, dim=0, stride=2), fc1)
    proj = torch.randn(4, 6)
    row_parts = [psh.shard(proj, dim=1, stride=1, tp=3, rank=r) for r in range(3)]
    assert torch.equal(row_parts[2], proj[:, 4:]) and torch.equal(psh.unshard(row_parts, dim=1, stride=1), proj)
    emb = torch.randn(5, 2)
    padded = psh.pad_vocab(emb, psh.padded_vocab_size(5, 2))
    assert padded.shape == (6, 2) and torch.equal(padded[:5], emb) and torch.all(padded[5] == 0)
    with pytest.raises(ValueError, match="divisible"):
        psh.shard(emb, dim=0, stride=1, tp=2, rank=0)


def test_dp_row_ranges_are_contiguous_near_equal_and_may_be_empty():
    assert dp_row_ranges(5, 2) == [(0, 3), (3, 5)]
    assert dp_row_ranges(1, 2) == [(0, 1), (1, 1)]
    assert dp_row_ranges(4, 1) == [(0, 4)]


def test_sizes_that_do_not_divide_the_model_and_pp_with_tied_embeddings_are_refused_in_one_line(model_dir, tmp_path):
    with pytest.raises(UserError, match="tensor_parallel=3 does not divide num_attention_heads=4"):
        MegatronEngine(model_dir, lr=1e-3, tensor_parallel=3)
    with pytest.raises(UserError, match="pipeline_parallel=3 does not divide num_hidden_layers=2"):
        MegatronEngine(model_dir, lr=1e-3, pipeline_parallel=3)
    cfg = json.loads((model_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    with pytest.raises(UserError, match="tied embeddings"):
        MegatronEngine(tmp_path, lr=1e-3, pipeline_parallel=2)
