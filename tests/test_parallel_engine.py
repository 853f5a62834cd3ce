"""Tensor / pipeline / data parallel MegatronEngine: sharding layouts, torchrun parity with one process.

The parity tests launch ``python -m torch.distributed.run --nproc-per-node 2`` (gloo, CPU) on
tests/dist/parallel_parity.py and compare every rank's results with the same run in this process (world 1):
logprobs before/after training, losses and grad norms of 3 PPO-like steps (step 1 clipped), the final HF
weights, and the HF directory written by ``save_hf`` (global rank 0 only).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from areal_cli.foundations.errors import UserError
from areal_cli.trainer import hf_mcore
from areal_cli.trainer import parallel_shard as psh
from areal_cli.trainer.collectives import dp_row_ranges
from areal_cli.trainer.megatron_engine import MegatronEngine
from helpers.perturbed_models import perturb_weights
from helpers.torchrun_parity import check_parity, load_parity_script, torchrun_parity

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """Tiny Qwen3 (GQA 4 query / 2 KV heads, MLP 256) with an ODD vocabulary (301: padded to 302 under TP=2)
    and every weight perturbed."""
    from areal_cli.models.tiny import build_tiny_model

    d = tmp_path_factory.mktemp("parallel_model")
    build_tiny_model(d, vocab_size=301, intermediate_size=256)
    return perturb_weights(d, 1)


@pytest.fixture(scope="module")
def reference(model_dir) -> dict:
    """The single-process run (world 1, TP 1) of the parity script's scenario."""
    return load_parity_script().run_parity(model_dir)


@pytest.mark.multiproc
@pytest.mark.slow
def test_tensor_parallel_2_matches_single_process(model_dir, reference, tmp_path):
    ranks = torchrun_parity(model_dir, tmp_path / "tp2", tp=2)
    assert [(r["tp"], r["pp"], r["dp"], r["world"]) for r in ranks] == [(2, 1, 1, 2)] * 2
    check_parity(ranks, reference, tmp_path / "tp2", model_dir)


@pytest.mark.multiproc
@pytest.mark.slow
def test_data_parallel_2_matches_single_process(model_dir, reference, tmp_path):
    ranks = torchrun_parity(model_dir, tmp_path / "dp2")
    assert [(r["tp"], r["pp"], r["dp"], r["world"]) for r in ranks] == [(1, 1, 2, 2)] * 2
    check_parity(ranks, reference, tmp_path / "dp2", model_dir)


@pytest.mark.multiproc
@pytest.mark.slow
def test_pipeline_parallel_2_matches_single_process(model_dir, reference, tmp_path):
    """Megatron's forward_backward_pipelining_without_interleaving on CPU (one layer per stage)."""
    ranks = torchrun_parity(model_dir, tmp_path / "pp2", pp=2)
    assert [(r["tp"], r["pp"], r["dp"], r["world"]) for r in ranks] == [(1, 2, 1, 2)] * 2
    check_parity(ranks, reference, tmp_path / "pp2", model_dir)


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
