"""The trainer's fused core attention (areal_cli/trainer/sdpa_attention.py) against megatron's own
DotProductAttention: same logits and gradients on packed rows (block-diagonal causal masks), plain causal rows
and grouped-query heads; masks it cannot express exactly go to megatron's forward."""

from __future__ import annotations

import pytest
import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention

from areal_cli.trainer.batch import build_train_batch
from areal_cli.trainer.megatron_engine import MegatronEngine
from areal_cli.trainer.micro_batches import split_by_tokens
from areal_cli.trainer.sdpa_attention import SdpaDotProductAttention
from helpers.perturbed_models import make_model_dir


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return MegatronEngine(make_model_dir(tmp_path_factory.mktemp("sdpa_model")), lr=1e-3, seed=0)


def _cores(engine):
    return [layer.self_attention.core_attention for layer in engine.model.decoder.layers]


def _set_core(engine, cls) -> None:
    for core in _cores(engine):
        core.__class__ = cls


def _packed_batch(vocab: int):
    g = torch.Generator().manual_seed(3)
    samples = []
    for p_len, r_len in ((3, 30), (4, 6), (2, 11), (5, 3), (3, 17), (2, 2)):
        ids = torch.randint(3, vocab, (p_len + r_len,), generator=g).tolist()
        samples.append((ids[:p_len], ids[p_len:], [-1.0] * r_len, [0] * r_len))
    batch = build_train_batch(samples, pad_id=0)
    (packed,) = split_by_tokens(batch, 4096)
    assert packed.packed and packed.batch_size < batch.batch_size  # several sequences share a row
    return batch, packed


def _logprobs_and_grads(engine, b):
    engine.model.zero_grad(set_to_none=True)
    engine.model.train()
    lp = engine._logprobs(b, 1.0)
    (lp * b.loss_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in engine.model.named_parameters()}
    engine.model.zero_grad(set_to_none=True)
    return lp.detach(), grads


def test_the_engine_builds_the_fused_core_attention(engine):
    assert all(type(c) is SdpaDotProductAttention for c in _cores(engine))
    assert engine.hf_config.num_attention_heads != engine.hf_config.num_key_value_heads  # grouped-query heads


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_fused_attention_matches_megatron_logprobs_and_gradients(engine, layout):
    batch, packed = _packed_batch(engine.vocab_size)
    b = packed if layout == "packed" else batch
    try:
        lp, grads = _logprobs_and_grads(engine, b)
        _set_core(engine, DotProductAttention)
        lp_ref, grads_ref = _logprobs_and_grads(engine, b)
    finally:
        _set_core(engine, SdpaDotProductAttention)
    real = b.loss_mask > 0
    assert real.sum() > 50
    assert torch.allclose(lp[real], lp_ref[real], atol=2e-5, rtol=0)
    for name, g in grads.items():
        assert torch.allclose(g, grads_ref[name], atol=2e-5, rtol=1e-4), name


def test_a_query_that_sees_no_key_goes_to_megatrons_forward(engine):
    core = _cores(engine)[0]
    sq, b, np_, ng, hn = 5, 2, core.num_attention_heads_per_partition, core.num_query_groups_per_partition, \
        core.hidden_size_per_attention_head
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sq, b, n, hn, generator=g) for n in (np_, ng, ng))
    mask = ~torch.ones(sq, sq, dtype=torch.bool).tril()[None, None].expand(b, 1, sq, sq).clone()
    fused = core(q, k, v, mask)
    ref = DotProductAttention.forward(core, q, k, v, mask)
    assert fused.shape == (sq, b, np_ * hn) and torch.allclose(fused, ref, atol=1e-6)
    mask[0, 0, 2, :] = True  # query 2 of row 0 may see nothing: megatron gives it uniform weights, not NaN
    out = core(q, k, v, mask)
    assert torch.isfinite(out).all()
    assert torch.equal(out, DotProductAttention.forward(core, q, k, v, mask))


def test_without_a_mask_the_modules_causal_type_decides_as_in_megatron(engine):
    from megatron.core.transformer.enums import AttnMaskType

    core = _cores(engine)[0]
    assert core.attn_mask_type == AttnMaskType.causal
    sq, b, hn = 6, 2, core.hidden_size_per_attention_head
    g = torch.Generator().manual_seed(1)
    q = torch.randn(sq, b, core.num_attention_heads_per_partition, hn, generator=g)
    k, v = (torch.randn(sq, b, core.num_query_groups_per_partition, hn, generator=g) for _ in range(2))
    ref = DotProductAttention.forward(core, q, k, v, None)
    assert torch.allclose(core(q, k, v, None), ref, atol=1e-6)
    # megatron ignores a per-call mask type; so does the fused forward
    assert torch.allclose(core(q, k, v, None, attn_mask_type=AttnMaskType.no_mask), ref, atol=1e-6)
    with pytest.raises(AssertionError):  # cross attention with its own causal mask: megatron refuses, so do we
        core(q, k[:4], v[:4], None)


def test_a_mask_that_is_not_block_diagonal_matches_megatron(engine):
    core = _cores(engine)[0]
    sq, b, hn = 9, 2, core.hidden_size_per_attention_head
    g = torch.Generator().manual_seed(2)
    q = torch.randn(sq, b, core.num_attention_heads_per_partition, hn, generator=g, requires_grad=True)
    k, v = (torch.randn(sq, b, core.num_query_groups_per_partition, hn, generator=g, requires_grad=True)
            for _ in range(2))
    mask = ~torch.ones(sq, sq, dtype=torch.bool).tril()[None, None].expand(b, 1, sq, sq).clone()
    mask[1, 0, 6, 3] = True  # row 1: query 6 may not see key 3 (no run structure)
    out = core(q, k, v, mask)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = DotProductAttention.forward(core, q, k, v, mask)
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    assert torch.allclose(out, ref, atol=1e-5)
    assert all(torch.allclose(a, r, atol=1e-4) for a, r in zip(grads, grads_ref))
