"""Micro-batches by token budget with packing: the RL step's loss, gradient and update equal the unsplit
batch's; packing keeps every token's logprob; a sequence over the budget is one clear error."""

from __future__ import annotations


import pytest
import torch

from areal_cli.config import TrainConfig
from areal_cli.foundations.errors import UserError
from areal_cli.trainer.batch import build_train_batch
from areal_cli.trainer.megatron_engine import MegatronEngine
from areal_cli.trainer.micro_batches import attention_cost, ffd_allocate, pack_rows, split_by_tokens, width_classes
from areal_cli.trainer.steps import ppo_update
from helpers.perturbed_models import make_model_dir

LENGTHS = ((3, 6), (5, 2), (2, 9), (7, 4), (4, 1), (6, 8), (3, 3), (8, 5))  # (prompt, response) tokens


def rl_batch(vocab: int, seed: int = 0):
    """Eight sequences of varied lengths with behaviour logprobs, mixed versions and +-1 advantages."""
    g = torch.Generator().manual_seed(seed)
    samples, adv = [], []
    for i, (p, r) in enumerate(LENGTHS):
        ids = torch.randint(3, vocab, (p + r,), generator=g).tolist()
        lps = (-torch.rand(r, generator=g) * 3).tolist()
        samples.append((ids[:p], ids[p:], lps, [i % 3] * r))
        adv.append(1.0 if i % 2 else -1.0)
    return build_train_batch(samples, pad_id=0, advantages=adv)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    d = make_model_dir(tmp_path_factory.mktemp("mb_model"))
    return MegatronEngine(d, lr=1e-3, seed=0)


def test_ffd_never_exceeds_the_budget_and_keeps_every_sequence():
    lengths = [9, 7, 11, 11, 5, 14, 6, 13]
    groups = ffd_allocate(lengths, 20)
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert all(sum(lengths[i] for i in g) <= 20 for g in groups)
    with pytest.raises(ValueError, match="exceeds the capacity"):
        ffd_allocate([21], 20)


def test_packed_rows_give_every_token_its_own_logprob(engine):
    b = rl_batch(engine.vocab_size)
    ref = engine.logprobs(b)
    packed = pack_rows(b, list(range(b.batch_size)))
    assert packed.packed and packed.batch_size < b.batch_size  # several sequences share a row
    assert int(packed.attention_mask.sum()) == int(b.attention_mask.sum())
    lp = engine.logprobs(packed)
    # every loss position of the packed layout maps back to one of the original batch: same values
    assert int(packed.loss_mask.sum()) == int(b.loss_mask.sum())
    got = sorted(lp[packed.loss_mask > 0].tolist())
    want = sorted(ref[b.loss_mask > 0].tolist())
    assert max(abs(x - y) for x, y in zip(got, want)) < 2e-6
    assert sorted(packed.behaviour_logprobs[packed.loss_mask > 0].tolist()) == \
        sorted(b.behaviour_logprobs[b.loss_mask > 0].tolist())
    # the position where one sequence would predict the next one's first token is never trained
    seg = packed.segment_ids
    boundary = (seg[:, 1:] != seg[:, :-1])
    assert not bool((packed.loss_mask[boundary] != 0).any()) and bool((packed.versions[boundary] == -1).all())


def test_split_respects_the_budget_and_refuses_a_longer_sequence():
    b = rl_batch(50)
    mbs = split_by_tokens(b, 20)
    assert len(mbs) >= 4 and all(int(m.attention_mask.sum()) <= 20 for m in mbs)
    assert sum(int(m.loss_mask.sum()) for m in mbs) == int(b.loss_mask.sum())
    with pytest.raises(UserError, match="field 'ppo.max_tokens_per_mb': a sequence of 14 tokens"):
        split_by_tokens(b, 13)


@pytest.mark.parametrize("n_minibatches,classes", [(1, False), (2, False), (1, True)])
def test_split_and_packed_update_equals_the_unsplit_one(engine, n_minibatches, classes, monkeypatch):
    """Loss, gradients (before each optimiser step), grad norm, clip fractions and the updated weights:
    micro-batches of <= 20 tokens (packed) vs one right-padded batch, from the same weights and optimizer state;
    ``classes``: an attention cost so high that every budget group is split into width classes too."""
    if classes:
        monkeypatch.setattr("areal_cli.trainer.micro_batches.attention_cost", lambda cfg: 1.0)
    base = TrainConfig().with_values({"ppo.n_minibatches": n_minibatches, "rollout.batch_size": 8, "ppo.eps_clip": 0.2,
                                       "ppo.behav_imp_weight_cap": 5.0})
    start = {k: v.clone() for k, v in engine.model.state_dict().items() if "_extra_state" not in k}
    start_flat = torch.cat([p.detach().flatten() for p in engine.model.parameters()]).clone()
    real_step = engine.optimizer_step
    results, weights, grads = {}, {}, {}
    for budget in (0, 20):
        engine.model.load_state_dict(start, strict=False)
        engine.optimizer.state.clear()
        seen = grads[budget] = []

        def capturing_step():
            seen.append(torch.cat([p.grad.flatten() for p in engine.model.parameters()]).clone())
            return real_step()

        monkeypatch.setattr(engine, "optimizer_step", capturing_step)
        cfg = base.with_values({"ppo.max_tokens_per_mb": budget})
        results[budget] = ppo_update(engine, rl_batch(engine.vocab_size), cfg)
        weights[budget] = torch.cat([p.detach().flatten() for p in engine.model.parameters()]).clone()
    monkeypatch.undo()
    engine.model.load_state_dict(start, strict=False)
    engine.optimizer.state.clear()
    one, split = results[0], results[20]
    assert split["n_micro_batches"] >= 4 and one["n_micro_batches"] == n_minibatches
    if classes:  # more micro-batches than the budget alone makes
        assert split["n_micro_batches"] > len(split_by_tokens(rl_batch(engine.vocab_size), 20))
    assert split["loss"] == pytest.approx(one["loss"], abs=1e-6)
    assert split["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert (split["clip_frac"], split["iw_capped_frac"]) == pytest.approx((one["clip_frac"], one["iw_capped_frac"]))
    assert len(grads[0]) == len(grads[20]) == n_minibatches
    g_diff = max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(grads[0], grads[20]))
    assert g_diff < 1e-5
    # AdamW's step is lr * m / (sqrt(v) + eps): ~lr whatever the gradient's size, and d(step)/dg = lr * eps /
    # (|g| + eps)^2, so a gradient within a few eps of 0 amplifies float rounding (Delta g ~ 1e-9) into a sizeable
    # part of a step. Where every minibatch's gradient is well above eps (> 1000 eps: the amplification is
    # < 1e-3 of the relative gradient error) the updates agree to 1 % of a step; anywhere, to within the steps taken.
    group = engine.optimizer.param_groups[0]
    well = torch.stack([g.abs() for g in grads[0]]).min(dim=0).values > 1000 * group["eps"]
    delta = (weights[0] - weights[20]).abs()
    diff = float(delta[well].max())
    moved = float((weights[0] - start_flat)[well].abs().max())
    assert int(well.sum()) > 0.5 * well.numel()  # most parameters
    assert moved > 5e-4 and diff < 0.01 * moved
    assert float(delta.max()) <= 2 * group["lr"] * n_minibatches
    print(f"minibatches {n_minibatches}: loss {one['loss']:.9f} vs {split['loss']:.9f}, grad norm rel diff "
          f"{abs(split['grad_norm'] / one['grad_norm'] - 1):.2e}, gradient max rel diff {g_diff:.2e}, weights max "
          f"diff {diff:.2e} (step {moved:.2e})")


def test_attention_cost_is_the_flop_ratio_by_hand():
    """2 x heads x head_dim x layers / dense weights (every matrix but the embedding; the output layer counts)."""
    cfg = {"model_type": "qwen3", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384, "vocab_size": 500,
           "tie_word_embeddings": False}
    dense = 2 * (128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 384 * 128) + 500 * 128
    assert attention_cost(cfg) == pytest.approx(2 * 4 * 32 * 2 / dense)
    assert attention_cost({**cfg, "tie_word_embeddings": True}) == pytest.approx(2 * 4 * 32 * 2 / dense)


def test_width_classes_pack_a_long_tail_apart():
    # a tiny-longtail-like block: 4 samples each of 16 answers (6-294 tokens) after a 12-token prompt
    lengths = [12 + a for a in (6, 6, 6, 6, 6, 12, 12, 18, 18, 24, 30, 42, 60, 84, 132, 294) for _ in range(4)]
    parts = width_classes(lengths, 1.2e-3)
    assert sorted(i for p in parts for i in p) == list(range(64))
    assert [lengths[i] for i in parts[0]] == [306] * 4 and max(lengths[i] for i in parts[1]) == 144
    # the estimated cost (tokens + c x rows x width^2) falls by the saving the split was taken for
    def cost(p):
        total, w = sum(lengths[i] for i in p), max(lengths[i] for i in p)
        return total + 1.2e-3 * -(-total // w) * w * w
    assert sum(cost(p) for p in parts) < 0.97 * cost(range(64))
    assert width_classes(lengths, 0.0) == [sorted(range(64), key=lambda i: (-lengths[i], i))]
    assert len(width_classes([50] * 10, 1.0)) == 1  # equal lengths: nothing to gain
    assert len(width_classes(lengths, 1.0, max_parts=3)) <= 3


def test_width_classes_keep_every_token_and_its_logprob(engine):
    b = rl_batch(engine.vocab_size)
    ref = engine.logprobs(b)
    mbs = split_by_tokens(b, 4096, attention_cost=1.0)
    assert len(mbs) > 1 and all(m.packed for m in mbs)
    assert all(m.seq_len == int(m.attention_mask.sum(dim=1).max()) for m in mbs)  # each at its own width
    got = sorted(x for m in mbs for x in engine.logprobs(m)[m.loss_mask > 0].tolist())
    want = sorted(ref[b.loss_mask > 0].tolist())
    assert len(got) == len(want) and max(abs(x - y) for x, y in zip(got, want)) < 2e-6


def test_small_groups_do_not_split_and_the_switch_turns_classes_off(engine, monkeypatch):
    # the fixed cost of one more pass (CLASS_OVERHEAD token-equivalents) outweighs a small group's saving
    assert len(width_classes([50, 7, 7], 1.2e-3)) == 1 and width_classes([], 1.0) == []
    assert width_classes([5, 0], 1.0) == [[0, 1]]  # no division by a zero width
    monkeypatch.setattr("areal_cli.trainer.micro_batches.attention_cost", lambda cfg: 1.0)
    cfg = TrainConfig().with_values({"rollout.batch_size": 8, "ppo.max_tokens_per_mb": 20,
                                     "ppo.pack_width_classes": False})
    out = ppo_update(engine, rl_batch(engine.vocab_size), cfg)
    assert out["n_micro_batches"] == len(split_by_tokens(rl_batch(engine.vocab_size), 20))
