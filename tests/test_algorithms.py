"""Algorithms as configuration (issue 41, first slice): every ``ppo`` algorithm key against a batch worked out by
hand, and for each a test-local *mutant* of its central line that the hand numbers reject.

The loss batch (2 sequences x 3 tokens, unless a test says otherwise): proximal logprobs 0, behaviour = proximal
(w = 1), so the ratio u = exp(logprobs); row 0 has A = +1 and u = (1.25, 1.0, 0.9), row 1 has A = -1 and
u = (1.3, 0.7, 1.0). Gradients are d loss / d logprobs (torch.autograd); d u / d logprob = u.

Sources (also in the functions' docstrings): DAPO (Yu et al. 2025, §3.1 clip-higher, §3.4 overlong shaping;
AReaL ``areal/api/cli_args.py`` ``eps_clip_higher``, ``overlong_*``); dual clip (Ye et al. 2020 §3.3; AReaL
``areal/utils/functional/functional.py:ppo_actor_loss_fn`` ``c_clip``); GSPO (Zheng et al. 2025 eq. 7; AReaL
``_compute_sequence_level_ratio_and_advantages``); CISPO (MiniMax-M1 2025 §3.1 eq. 4); loss aggregation (verl
``verl/trainer/ppo/core_algos.py:agg_loss``; Dr.GRPO, Liu et al. 2025 §3.2); advantages (AReaL ``NormConfig``:
GRPO, Shao et al. 2024; Dr.GRPO; RLOO, Ahmadian et al. 2024 §3.2; LitePPO, Liu et al. 2025 "Tricks or Traps" §4.1).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_cli.config import TrainConfig
from areal_cli.config.listing import describe_settings
from areal_cli.foundations.errors import UserError
from areal_cli.trainer.advantages import overlong_penalty, reward_norm_advantages, zero_std_group_fraction
from areal_cli.trainer.decoupled_ppo import DecoupledPPOConfig, decoupled_ppo_loss
from areal_cli.trainer.loss_terms import aggregate

U = torch.tensor([[1.25, 1.0, 0.9], [1.3, 0.7, 1.0]], dtype=torch.float64)
A = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64)


def _loss(u: torch.Tensor = U, adv: torch.Tensor = A, mask: torch.Tensor | None = None, **cfg):
    """(loss, grad w.r.t. logprobs, stats) of the decoupled loss on the batch (w = 1)."""
    lp = u.log().clone().requires_grad_(True)
    zero = torch.zeros_like(u)
    mask = torch.ones_like(u) if mask is None else mask
    n_seqs = cfg.pop("n_seqs", None)
    loss, st = decoupled_ppo_loss(lp, zero, zero, adv, mask, float(mask.sum()), DecoupledPPOConfig(**cfg),
                                  n_sequences_global=n_seqs)
    loss.backward()
    return float(loss.detach()), lp.grad, st


# ---------------------------------------------------------------------------------------------- a. clip-higher
def test_clip_higher_by_hand_and_mutant():
    """DAPO clip-higher (Yu et al. 2025 §3.1; AReaL ``eps_clip_higher``): u clipped to [1 - 0.2, 1 + 0.28].

    Symmetric eps 0.2: row 0 tokens -min(u, clip u) = -1.2, -1.0, -0.9 (sum -3.1); row 1 max(u, clip u) = 1.3, 0.8,
    1.0 (sum 3.1); loss = 0 / 6 = 0, and token (0, 0) is clipped: gradient 0.
    eps_high 0.28: u = 1.25 < 1.28 is no longer clipped: row 0 sums to -3.15, loss = -0.05 / 6 = -0.0083333, and
    the gradient of token (0, 0) is -A u / 6 = -1.25 / 6 = -0.2083333.
    """
    loss, grad, _ = _loss(eps_clip=0.2, eps_clip_higher=0.28)
    assert loss == pytest.approx(-0.05 / 6, abs=1e-9)
    assert float(grad[0, 0]) == pytest.approx(-1.25 / 6, abs=1e-9)
    # mutant: the central line ignores eps_clip_higher (symmetric clip) -> the hand numbers fail
    sym_loss, sym_grad, _ = _loss(eps_clip=0.2)
    assert sym_loss == pytest.approx(0.0, abs=1e-9) and float(sym_grad[0, 0]) == 0.0
    assert sym_loss != pytest.approx(loss, abs=1e-6) and float(sym_grad[0, 0]) != pytest.approx(-1.25 / 6)


# ---------------------------------------------------------------------------------------------- b. dual clip
def test_dual_clip_by_hand_and_mutant():
    """Dual clip (Ye et al. 2020 §3.3; AReaL ``c_clip``): for A < 0 the token loss is at most c |A|.

    Row 1 token 0 has u = 4 (A = -1): PPO's loss max(4, 1.2) = 4 > c |A| = 3 -> 3. Row 1 sums 3 + 0.8 + 1.0 = 4.8,
    row 0 -3.1: loss = 1.7 / 6 = 0.2833333; the bound is constant in theta: gradient 0 at token (1, 0).
    """
    u = U.clone()
    u[1, 0] = 4.0
    loss, grad, st = _loss(u, eps_clip=0.2, c_clip=3.0)
    assert loss == pytest.approx(1.7 / 6, abs=1e-9) and float(grad[1, 0]) == 0.0 and st["n_dual_clipped"] == 1
    # A > 0 tokens are untouched (row 0 gradients as plain PPO: 0 (clipped), -1/6, -0.9/6)
    assert grad[0].tolist() == pytest.approx([0.0, -1 / 6, -0.9 / 6], abs=1e-9)
    # mutant: no dual clip -> loss 2.7 / 6 and gradient u / 6 = 4 / 6 at (1, 0)
    plain_loss, plain_grad, _ = _loss(u, eps_clip=0.2)
    assert plain_loss == pytest.approx(2.7 / 6) and float(plain_grad[1, 0]) == pytest.approx(4 / 6)
    # mutant: the bound applied on both signs (min(pg, c * A) instead of c * |A|) changes the A > 0 row
    signed = torch.minimum(torch.maximum(-A * u, -A * u.clamp(0.8, 1.2)), 3.0 * A)
    assert float(signed.sum() / 6) != pytest.approx(loss, abs=1e-6)
    with pytest.raises(ValueError, match="c_clip must be > 1"):
        DecoupledPPOConfig(c_clip=1.0)


# ---------------------------------------------------------------------------------------------- c. aggregation
def test_loss_aggregation_by_hand_and_mutants():
    """verl ``agg_loss`` / Dr.GRPO §3.2: row 0 has 3 loss tokens (A = +1), row 1 one token (A = -2), u = 1.

    Per-token loss -A u: row 0 (-1, -1, -1), row 1 (2).
    token-mean: (-3 + 2) / 4 = -0.25; grads (0,0) = -1/4, (1,0) = 2/4.
    seq-mean-token-mean: (-3/3 + 2/1) / 2 = 0.5; grads (0,0) = -1/(3*2) = -1/6, (1,0) = 2/2 = 1.
    seq-mean-token-sum-norm (L = 4): (-3 + 2) / (2 * 4) = -0.125; grads (0,0) = -1/8, (1,0) = 2/8.
    Each mode's numbers differ from the others': a mutant that falls back to another mode fails.
    """
    u = torch.ones(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0] * 3, [-2.0, 0, 0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float64)
    want = {"token-mean": (-0.25, -1 / 4, 2 / 4), "seq-mean-token-mean": (0.5, -1 / 6, 1.0),
            "seq-mean-token-sum-norm": (-0.125, -1 / 8, 2 / 8)}
    got = {}
    for mode, (l_want, g00, g10) in want.items():
        loss, grad, _ = _loss(u, adv, mask, loss_agg_mode=mode, loss_agg_norm_tokens=4, n_seqs=2)
        assert loss == pytest.approx(l_want, abs=1e-9), mode
        assert (float(grad[0, 0]), float(grad[1, 0])) == pytest.approx((g00, g10), abs=1e-9), mode
        got[mode] = loss
    assert len({round(v, 6) for v in got.values()}) == 3
    # packed rows: the two sequences end to end in one row give the same seq-mean-token-mean
    packed = aggregate(torch.tensor([[-1.0, -1, -1, 2]]), torch.ones(1, 4, dtype=torch.bool), "seq-mean-token-mean",
                       4, 2, sequence_ids=torch.tensor([[0, 0, 0, 1]]))
    assert float(packed) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="n_sequences_global"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "seq-mean-token-mean", 1)


# ---------------------------------------------------------------------------------------------- d. GSPO
def test_gspo_sequence_ratio_by_hand_and_mutant():
    """GSPO (Zheng et al. 2025 eq. 7): s_i = exp(mean_t log u_t), one ratio per sequence.

    s_0 = exp((ln 1.25 + 0 + ln 0.9) / 3) = 1.0400419, s_1 = exp((ln 1.3 + ln 0.7 + 0) / 3) = 0.9690521; eps 0.2
    clips neither. Token-mean loss = (-3 s_0 + 3 s_1) / 6 = -0.0354949. d loss / d lp_0t = -s_0 / 3 * 3 / 6 = -s_0 / 6
    = -0.1733403 for every token of row 0 (the sequence shares one ratio).
    """
    s0, s1 = 1.0400419115, 0.9690521083
    loss, grad, _ = _loss(eps_clip=0.2, importance_sampling_level="sequence")
    assert loss == pytest.approx((s1 - s0) / 2, abs=1e-8)
    assert grad[0].tolist() == pytest.approx([-s0 / 6] * 3, abs=1e-8)
    assert grad[1].tolist() == pytest.approx([s1 / 6] * 3, abs=1e-8)
    # mutant: token-level ratio (the central line left out) -> row 0 gradients differ token by token
    _, tok_grad, _ = _loss(eps_clip=0.2)
    assert tok_grad[0].tolist() != pytest.approx([-s0 / 6] * 3, abs=1e-4)
    # with GSPO's clip 3e-4 / 4e-4, s_0 = 1.04 > 1.0004 is clipped (A > 0): no gradient on row 0
    _, g_clip, _ = _loss(eps_clip=3e-4, eps_clip_higher=4e-4, importance_sampling_level="sequence")
    assert g_clip[0].abs().max() == 0.0 and g_clip[1].abs().max() == 0.0  # s_1 = 0.969 < 1 - 3e-4, A < 0: clipped


def test_gspo_with_sequence_behaviour_weight_by_hand():
    """GSPO x decoupled loss: the behaviour weight is the sequence's geometric mean (``sequence_truncate``).

    Behaviour logprobs of row 0 are (-0.3, 0, 0) below the proximal 0, so w_0 = exp(0.3 / 3) = exp(0.1) = 1.1051709
    on every token; row 1 has w = 1. Gradient of row 0 = w_0 * (-s_0 / 6) = -0.1915704.
    """
    lp = U.log().clone().requires_grad_(True)
    prox = torch.zeros_like(U)
    behav = torch.tensor([[-0.3, 0, 0], [0, 0, 0]], dtype=torch.float64)
    cfg = DecoupledPPOConfig(eps_clip=0.2, behav_imp_weight_mode="sequence_truncate", importance_sampling_level="sequence")
    loss, _ = decoupled_ppo_loss(lp, prox, behav, A, torch.ones_like(U), 6.0, cfg)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([-math.exp(0.1) * 1.0400419115 / 6] * 3, abs=1e-8)


# ---------------------------------------------------------------------------------------------- g. CISPO
def test_cispo_by_hand_and_mutants():
    """CISPO (MiniMax-M1 2025 §3.1 eq. 4): loss_t = -sg(clip(u_t, 1 - eps_low, 1 + eps_high)) A_t log pi_theta.

    eps_low 1 (no lower bound), eps_high 0.28. Gradient = -clip(u) A / 6: row 0 (A = +1): -1.25/6, -1/6, -0.9/6;
    row 1 (A = -1): clip(1.3) = 1.28 -> 1.28/6, 0.7/6, 1/6. PPO (eps 0.2) gives 0 at (0, 0) (clipped); CISPO keeps
    a bounded gradient there.
    """
    _, grad, st = _loss(loss_fn="cispo", eps_clip=1.0, eps_clip_higher=0.28)
    assert grad[0].tolist() == pytest.approx([-1.25 / 6, -1 / 6, -0.9 / 6], abs=1e-9)
    assert grad[1].tolist() == pytest.approx([1.28 / 6, 0.7 / 6, 1 / 6], abs=1e-9)
    assert st["n_clipped"] == 1
    # mutant 1: PPO's clipped objective instead -> gradient 0 at (0, 0)
    _, ppo_grad, _ = _loss(eps_clip=0.2)
    assert float(ppo_grad[0, 0]) == 0.0
    # mutant 2: no stop-gradient on the weight: d/dlp of -u A lp = -A u (1 + lp) at unclipped tokens
    lp = U.log().clone().requires_grad_(True)
    w = torch.exp(lp).clamp(0.0, 1.28)
    (-(w * A * lp).sum() / 6).backward()
    assert lp.grad[0].tolist() != pytest.approx(grad[0].tolist(), abs=1e-4)


# ---------------------------------------------------------------------------------------------- e. advantages
#: 3 groups of 3: g0 = (1, 0, 0), g1 = (3, 1, 2), g2 = (1, 1, 1) (zero variance: "dead").
R = torch.tensor([1.0, 0, 0, 3, 1, 2, 1, 1, 1])
G = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])


@pytest.mark.parametrize("levels, want", [
    # GRPO: g0 mean 1/3, std sqrt(2/9) = 0.4714045 -> (2/3, -1/3, -1/3) / 0.4714145; g1 mean 2, std sqrt(2/3) =
    # 0.8164966 -> (1, -1, 0) / 0.8165066; g2 dead -> 0.
    (("group", "group", False), [1.4141836, -0.7070918, -0.7070918, 1.2247299, -1.2247299, 0, 0, 0, 0]),
    # Dr.GRPO: no std: r - group mean.
    (("group", "none", False), [2 / 3, -1 / 3, -1 / 3, 1, -1, 0, 0, 0, 0]),
    # RLOO: r_i - mean of the others: g0 1 - 0, 0 - 1/2, 0 - 1/2; g1 3 - 3/2, 1 - 5/2, 2 - 2.
    (("group", "none", True), [1, -0.5, -0.5, 1.5, -1.5, 0, 0, 0, 0]),
    # LitePPO: group mean, batch std: batch mean 10/9, E[r^2] = 18/9, var = 2 - 100/81 = 62/81, std = 0.8748897:
    # g0 (2/3) / 0.8748997 = 0.7619920, g1 1 / 0.8748997 = 1.1429881.
    (("group", "batch", False), [0.7619920, -0.3809960, -0.3809960, 1.1429881, -1.1429881, 0, 0, 0, 0]),
])
def test_advantage_rules_by_hand(levels, want):
    """AReaL ``NormConfig`` rules (``reward_norm``): GRPO, Dr.GRPO, RLOO (Ahmadian et al. 2024 eq. 9), LitePPO."""
    assert reward_norm_advantages(R, G, *levels).tolist() == pytest.approx(want, abs=1e-6)


def test_advantage_rule_mutants_and_dead_groups():
    """Each rule's central line matters: the four rules give four different vectors on the same rewards (a mutant
    dropping the std, the leave-one-out or the batch std turns one into another); g2 (dead) is 1/3 of the groups."""
    rules = [("group", "group", False), ("group", "none", False), ("group", "none", True), ("group", "batch", False)]
    outs = [tuple(round(x, 5) for x in reward_norm_advantages(R, G, *lv).tolist()) for lv in rules]
    assert len(set(outs)) == 4
    assert zero_std_group_fraction(R, G) == pytest.approx(1 / 3)
    # a batch baseline keeps a signal for the dead group: 1 - 10/9 = -1/9
    assert reward_norm_advantages(R, G, "batch", "none")[6] == pytest.approx(-1 / 9)
    with pytest.raises(ValueError, match="leave1out"):
        reward_norm_advantages(R, G, "batch", "none", leave1out=True)


# ---------------------------------------------------------------------------------------------- f. overlong
def test_overlong_penalty_by_hand_and_mutant():
    """DAPO §3.4 eq. 13 / AReaL ``reward_overlong_penalty``: L_max 10, L_cache 4, factor 1: no penalty up to 6
    tokens, then -(len - 6) / 4: lengths 5, 6, 8, 10 -> 0, 0, -0.5, -1."""
    got = overlong_penalty(torch.tensor([5, 6, 8, 10]), 10, 4, 1.0)
    assert got.tolist() == pytest.approx([0, 0, -0.5, -1.0])
    # mutant: measuring the excess from L_max instead of L_max - L_cache -> no penalty at all
    mutant = (-(torch.tensor([5, 6, 8, 10.0]) - 10) / 4).clamp(max=0)
    assert mutant.tolist() != pytest.approx(got.tolist())


def test_make_train_batch_with_rloo_and_overlong():
    """The trainer's batch: rloo preset advantages per token, and the overlong penalty before them."""
    from areal_cli.api.types import Group, Item, Trajectory
    from areal_cli.trainer.steps import make_train_batch

    def group(gi, rewards, lens):
        return Group(gi, Item(str(gi), [1, 2], ""), [Trajectory([1, 2], [5] * n, [-0.1] * n, [0] * n, r, gi, "stop")
                                                     for r, n in zip(rewards, lens)])

    cfg = TrainConfig().with_values({"ppo.algorithm": "rloo", "rollout.max_new_tokens": 4})
    cfg.validate()
    batch = make_train_batch([group(0, [1.0, 0.0, 0.0], [2, 2, 2])], cfg, pad_id=0)
    assert batch.advantages.max(dim=1).values.tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert batch.advantages.min(dim=1).values.tolist() == pytest.approx([0.0, -0.5, -0.5])
    # overlong (L 4, L_cache 2): a 4-token answer loses 1, a 3-token one 0.5: rewards (1, 1, 1) -> (1, 0.5, 0)
    cfg = TrainConfig().with_values({"ppo.overlong_reward_penalty": True, "ppo.overlong_tokens": 2,
                                     "ppo.reward_norm_std_level": "none", "rollout.max_new_tokens": 4})
    cfg.validate()
    batch = make_train_batch([group(0, [1.0, 1.0, 1.0], [2, 3, 4])], cfg, pad_id=0)
    assert batch.advantages.sum(dim=1).tolist() == pytest.approx([0.5 * 2, 0.0 * 3, -0.5 * 4])


# ---------------------------------------------------------------------------------------------- h. presets
def test_presets_fill_unset_keys_only_and_switch_back():
    cfg = TrainConfig().with_values({"ppo.algorithm": "gspo", "ppo.eps_clip": 0.1})
    cfg.validate()
    p = cfg.ppo
    assert (p.importance_sampling_level, p.eps_clip, p.eps_clip_higher, p.loss_agg_mode, p.behav_imp_weight_mode) == \
        ("sequence", 0.1, 4e-4, "seq-mean-token-mean", "sequence_mask")
    back = cfg.with_values({"ppo.algorithm": "grpo"})
    back.validate()
    assert (back.ppo.importance_sampling_level, back.ppo.eps_clip_higher, back.ppo.loss_agg_mode,
            back.ppo.behav_imp_weight_mode, back.ppo.eps_clip) == ("token", None, "token-mean", "token_mask", 0.1)
    default = TrainConfig()
    default.validate()
    assert default.ppo == TrainConfig().ppo  # grpo fills nothing: today's settings
    for name in ("dr_grpo", "dapo", "rloo", "cispo"):
        TrainConfig().with_values({"ppo.algorithm": name}).validate()
    text = "\n".join(describe_settings(TrainConfig()))
    assert "preset gspo: ppo.importance_sampling_level=sequence" in text and "preset grpo: nothing" in text


@pytest.mark.parametrize("values, key", [
    ({"ppo.algorithm": "gspo", "ppo.behav_imp_weight_mode": "token_mask"}, "ppo.importance_sampling_level"),
    ({"ppo.loss_fn": "cispo", "ppo.importance_sampling_level": "sequence",
      "ppo.behav_imp_weight_mode": "sequence_mask"}, "ppo.loss_fn"),
    ({"ppo.algorithm": "cispo", "ppo.c_clip": 3.0}, "ppo.c_clip"),
    ({"ppo.c_clip": 0.5}, "ppo.c_clip"),
    ({"ppo.adv_norm": "global", "ppo.reward_norm_std_level": "none"}, "ppo.reward_norm_std_level"),
    ({"ppo.algorithm": "rloo", "rollout.group_size": 1}, "ppo.reward_norm_mean_leave1out"),
])
def test_bad_combinations_are_one_line(values, key):
    with pytest.raises(UserError, match=f"field '{key}'") as e:
        TrainConfig().with_values(values).validate()
    assert "\n" not in str(e.value)


def test_bad_combination_exits_2_before_any_work():
    areal = Path(sys.executable).parent / "areal"
    r = subprocess.run([str(areal), "train", "-o", "ppo.algorithm=gspo", "-o", "ppo.behav_imp_weight_mode=token_mask"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "ppo.importance_sampling_level" in lines[0] and "ppo.behav_imp_weight_mode" in lines[0]


def test_preset_keeps_values_of_a_config_built_in_code():
    """A config whose ppo section was built in code (a published recipe's mapping) keeps its non-default values."""
    from areal_cli.config.sections import PPOSection

    cfg = TrainConfig(ppo=PPOSection(eps_clip=0.25, behav_imp_weight_mode="sequence_mask"))
    cfg.validate()
    assert (cfg.ppo.eps_clip, cfg.ppo.behav_imp_weight_mode) == (0.25, "sequence_mask")
    cfg.ppo.algorithm = "dapo"
    cfg.validate()
    assert (cfg.ppo.eps_clip, cfg.ppo.eps_clip_higher) == (0.25, 0.28)
