"""Off-policy corrections of the behaviour weight w = pi_prox / pi_behav (loss options), each against a hand
computation in plain Python (no torch in the expected values), and the per-step diagnostics: importance-weight
quantiles and the engine-vs-trainer logprob mismatch on tokens of the trainer's own version.

References of the rules: areal_cli/trainer/decoupled_ppo.py's module docstring (AReaL boba² eq. 5 token_mask;
truncated IS, Yao et al. 2025; sequence-level masked IS, Liu et al. 2025 / AReaL 2.0 rejection_sampling;
IcePop's two-sided mask)."""

from __future__ import annotations

import math

import pytest
import torch

from areal_cli.config import BEHAV_IMP_WEIGHT_MODES as CONFIG_MODES
from areal_cli.config import TrainConfig
from areal_cli.foundations.errors import UserError
from areal_cli.trainer.batch import TrainBatch
from areal_cli.trainer.decoupled_ppo import (
    BEHAV_IMP_WEIGHT_MODES,
    DecoupledPPOConfig,
    decoupled_ppo_loss,
)
from areal_cli.trainer.steps import off_policy_diagnostics
from helpers.one_line import assert_one_line

EPS = 0.2
# Two sequences (rows) of 3 loss tokens; log w = prox - behav chosen to fall on each side of the bounds.
LOG_W = [[math.log(0.3), math.log(1.2), math.log(8.0)],  # a token below 0.5, one inside, one above 5
         [math.log(2.0), math.log(3.0), math.log(4.0)]]
PROX = [[-1.0, -0.5, -2.0], [-0.7, -1.1, -0.3]]
LOGP = [[-0.9, -0.6, -1.5], [-0.7, -0.8, -0.35]]  # current policy: ratios u = exp(logp - prox)
ADV = [[1.0, -1.0, 0.5], [-0.5, 2.0, 1.0]]


def tensors():
    prox = torch.tensor(PROX, dtype=torch.float64)
    behav = prox - torch.tensor(LOG_W, dtype=torch.float64)
    return (torch.tensor(LOGP, dtype=torch.float64), prox, behav, torch.tensor(ADV, dtype=torch.float64),
            torch.ones(2, 3, dtype=torch.float64))


def ppo_term(b: int, t: int) -> float:
    """-min(u A, clip(u) A) by hand."""
    u = math.exp(LOGP[b][t] - PROX[b][t])
    a = ADV[b][t]
    return max(-a * u, -a * min(max(u, 1 - EPS), 1 + EPS))


def hand_loss(weight) -> float:
    return sum(ppo_term(b, t) * weight(b, t) for b in range(2) for t in range(3)) / 6


def seq_w(b: int) -> float:
    return math.exp(sum(LOG_W[b]) / 3)  # geometric mean of the token weights


CASES = {
    "token_mask cap 5": (DecoupledPPOConfig(EPS, 5.0, "token_mask"),
                         lambda b, t: 0.0 if math.exp(LOG_W[b][t]) > 5 else math.exp(LOG_W[b][t]), 1, 0),
    "IcePop: token_mask in [0.5, 5]": (DecoupledPPOConfig(EPS, 5.0, "token_mask", 0.5),
                                       lambda b, t: math.exp(LOG_W[b][t]) if 0.5 <= math.exp(LOG_W[b][t]) <= 5 else 0.0,
                                       2, 0),
    "token_truncate cap 2.5 (TIS)": (DecoupledPPOConfig(EPS, 2.5, "token_truncate"),
                                     lambda b, t: min(math.exp(LOG_W[b][t]), 2.5), 0, 3),
    "sequence_mask cap 2.5 (MIS)": (DecoupledPPOConfig(EPS, 2.5, "sequence_mask"),
                                    lambda b, t: 0.0 if seq_w(b) > 2.5 else seq_w(b), 3, 0),
    "sequence_mask in [0.9, 5]": (DecoupledPPOConfig(EPS, 5.0, "sequence_mask", 0.9),
                                  lambda b, t: seq_w(b) if 0.9 <= seq_w(b) <= 5 else 0.0, 0, 0),
    "sequence_truncate cap 2.5": (DecoupledPPOConfig(EPS, 2.5, "sequence_truncate"),
                                  lambda b, t: min(seq_w(b), 2.5), 0, 3),
    "disabled": (DecoupledPPOConfig(EPS, 5.0, "disabled"), lambda b, t: 1.0, 0, 0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_correction_matches_the_hand_computed_loss_and_counts(name):
    cfg, weight, n_masked, n_truncated = CASES[name]
    lp, prox, behav, adv, mask = tensors()
    loss, stats = decoupled_ppo_loss(lp, prox, behav, adv, mask, 6, cfg)
    assert float(loss) == pytest.approx(hand_loss(weight), rel=1e-12, abs=1e-14)
    assert (stats["n_iw_capped"], stats["n_iw_truncated"]) == (n_masked, n_truncated)


def test_the_sequence_weights_behave_as_expected_on_these_numbers():
    """Guards the test data: row 0's geometric mean is ~1.42 (kept at cap 2.5), row 1's ~2.88 (masked)."""
    assert 1.3 < seq_w(0) < 1.5 and 2.8 < seq_w(1) < 3.0


def test_sequence_modes_treat_packed_sequences_separately():
    """Two sequences packed in one row (segment ids 0 and 1) get the same weights as when they are two rows."""
    lp, prox, behav, adv, mask = tensors()
    cfg = DecoupledPPOConfig(EPS, 2.5, "sequence_mask")
    rows, _ = decoupled_ppo_loss(lp, prox, behav, adv, mask, 6, cfg)
    packed = [t.reshape(1, 6) for t in (lp, prox, behav, adv, mask)]
    seg = torch.tensor([[0, 0, 0, 1, 1, 1]])
    one_row, stats = decoupled_ppo_loss(*packed, 6, cfg, sequence_ids=seg)
    assert float(one_row) == pytest.approx(float(rows), rel=1e-12) and stats["n_iw_capped"] == 3
    merged, _ = decoupled_ppo_loss(*packed, 6, cfg)  # without the ids: one sequence of 6 tokens (a different loss)
    assert float(merged) != pytest.approx(float(rows), rel=1e-6)


def test_masked_and_padded_tokens_never_count():
    lp, prox, behav, adv, mask = tensors()
    mask[1, 2] = 0.0
    behav[1, 2] = -50.0  # a huge weight on a token outside the loss mask changes nothing
    cfg = DecoupledPPOConfig(EPS, 2.5, "sequence_truncate")
    loss, stats = decoupled_ppo_loss(lp, prox, behav, adv, mask, 5, cfg)
    w1 = math.exp((LOG_W[1][0] + LOG_W[1][1]) / 2)
    expected = (sum(ppo_term(0, t) * min(seq_w(0), 2.5) for t in range(3))
                + sum(ppo_term(1, t) * min(w1, 2.5) for t in range(2))) / 5
    assert float(loss) == pytest.approx(expected, rel=1e-12) and stats["n_tokens"] == 5


def test_config_refuses_bad_settings_with_one_line():
    with pytest.raises(ValueError, match="behav_imp_weight_mode must be one of"):
        DecoupledPPOConfig(behav_imp_weight_mode="icepop")
    with pytest.raises(ValueError, match="cap must be > 1"):
        DecoupledPPOConfig(behav_imp_weight_cap=1.0)
    with pytest.raises(ValueError, match="mask modes only"):
        DecoupledPPOConfig(behav_imp_weight_mode="token_truncate", behav_imp_weight_lower=0.5)
    assert CONFIG_MODES == BEHAV_IMP_WEIGHT_MODES
    for values, field in (({"ppo.behav_imp_weight_mode": "nope"}, "ppo.behav_imp_weight_mode"),
                          ({"ppo.behav_imp_weight_cap": 0.5}, "ppo.behav_imp_weight_cap"),
                          ({"ppo.behav_imp_weight_lower": 1.5}, "ppo.behav_imp_weight_lower"),
                          ({"ppo.behav_imp_weight_mode": "token_truncate", "ppo.behav_imp_weight_lower": 0.5},
                           "ppo.behav_imp_weight_lower"),
                          ({"rollout.top_p": 0.95}, "rollout.top_p"),
                          ({"ppo.prox_logp_method": "loglinear"}, "ppo.prox_logp_method"),
                          ({"ppo.prox_logp_method": "reuse", "rollout.batch_size": 16, "ppo.n_minibatches": 2},
                           "ppo.prox_logp_method"),
                          ({"rollout.stale_groups": "keep"}, "rollout.stale_groups")):
        with pytest.raises(UserError, match=f"field '{field}'"):
            TrainConfig().with_values(values).validate("cfg.yaml")


def test_truncated_sampling_in_training_is_refused_with_one_clear_line():
    with pytest.raises(UserError) as err:
        TrainConfig().with_values({"rollout.top_p": 0.9}).validate("cfg.yaml")
    assert_one_line(str(err.value), "untruncated")
    TrainConfig().with_values({"rollout.top_k": 1000000}).validate("cfg.yaml")  # AReaL's "off" value stays allowed (checked against the vocab)


def _batch(prox, behav, versions, mask) -> TrainBatch:
    B, T = len(prox), len(prox[0])
    b = TrainBatch(input_ids=torch.zeros(B, T + 1, dtype=torch.long), attention_mask=torch.ones(B, T + 1, dtype=torch.bool),
                   loss_mask=torch.tensor(mask, dtype=torch.float32), behaviour_logprobs=torch.tensor(behav),
                   versions=torch.tensor(versions, dtype=torch.long))
    b.proximal_logprobs = torch.tensor(prox)
    return b


def test_diagnostics_quantiles_and_mismatch_on_the_trainers_own_version_by_hand():
    prox = [[-1.0, -2.0, -0.5, 0.0], [-1.5, -0.25, -3.0, 0.0]]
    behav = [[-1.0, -2.5, -0.5 + 2e-6, 0.0], [-1.0, -0.25 - 5e-5, -3.0, -9.0]]
    versions = [[3, 2, 3, -1], [2, 3, 3, -1]]  # the trainer holds version 3; position 3 is padding
    mask = [[1, 1, 1, 0], [1, 1, 1, 0]]
    d = off_policy_diagnostics([_batch(prox, behav, versions, mask)], trainer_version=3, recomputed=True,
                               float32=True)
    w = sorted(math.exp(p - b) for rp, rb, rm in zip(prox, behav, mask) for p, b, m in zip(rp, rb, rm) if m)
    assert d["iw_min"] == pytest.approx(w[0]) and d["iw_max"] == pytest.approx(w[-1])
    assert d["iw_p50"] == pytest.approx((w[2] + w[3]) / 2)  # linear interpolation, as numpy/torch quantile
    own = [abs(p - b) for rp, rb, rv, rm in zip(prox, behav, versions, mask)
           for p, b, v, m in zip(rp, rb, rv, rm) if m and v == 3]
    assert d["logprob_mismatch_tokens"] == 4
    assert d["logprob_mismatch_max"] == pytest.approx(max(own), rel=1e-3)  # float32 inputs
    assert d["logprob_mismatch_mean"] == pytest.approx(sum(own) / 4, rel=1e-3)
    assert d["logprob_mismatch_flagged"] is False  # 5e-5 < 1e-4
    behav[1][1] = -0.25 - 3e-4
    d = off_policy_diagnostics([_batch(prox, behav, versions, mask)], 3, True, float32=True)
    assert d["logprob_mismatch_flagged"] is True
    assert off_policy_diagnostics([_batch(prox, behav, versions, mask)], 3, True, float32=False)[
        "logprob_mismatch_flagged"] is False  # bf16 trainers differ more; the flag is for float32
    naive = off_policy_diagnostics([_batch(prox, behav, versions, mask)], 3, recomputed=False, float32=True)
    assert naive["logprob_mismatch_max"] is None and naive["logprob_mismatch_tokens"] == 0


def test_in_place_updates_leave_only_tokens_with_their_own_versions_kv_in_the_mismatch_by_hand():
    from areal_cli.api.types import Group, Item, Trajectory
    from areal_cli.trainer.steps import MIXED_KV_VERSION, kv_versions, make_train_batch

    # a sample that started under version 2 and crossed two in-place updates: only its version-2 tokens had
    # their whole prefix (and the prompt's KV) computed by the weights that produced them
    assert kv_versions([2, 2, 3, 3, 4]) == [2, 2, MIXED_KV_VERSION, MIXED_KV_VERSION, MIXED_KV_VERSION]
    assert kv_versions([-1, 3, 3, -1, 4]) == [-1, 3, 3, -1, MIXED_KV_VERSION]  # environment tokens stay -1
    assert kv_versions([5, 5]) == [5, 5] and kv_versions([]) == []

    def batch(pause_mode: str):
        cfg = TrainConfig().with_values({"rollout.pause_mode": pause_mode})
        # sample 0 started under version 3 (the trainer's); sample 1 under 2 and crossed the update to 3
        samples = [Trajectory([1, 2], [5, 6, 7], [-0.5, -0.6, -0.7], [3, 3, 3], 1.0, 0, "stop"),
                   Trajectory([1, 2], [8, 9, 10], [-0.8, -0.9, -1.0], [2, 3, 3], 0.0, 0, "stop")]
        return make_train_batch([Group(0, Item("q", [1, 2], ""), samples)], cfg, pad_id=0)

    abort, in_place = batch("abort"), batch("in_place")
    assert abort.versions.tolist() == [[-1, 3, 3, 3], [-1, 2, 3, 3]]  # re-prefilled: the version is the KV's too
    assert in_place.versions.tolist() == [[-1, 3, 3, 3], [-1, 2, MIXED_KV_VERSION, MIXED_KV_VERSION]]
    for b in (abort, in_place):  # the trainer reproduces sample 0 exactly and sample 1's stale-KV tokens not
        b.proximal_logprobs = b.behaviour_logprobs.clone()
        b.proximal_logprobs[1, 2:] -= 0.3
    d_abort = off_policy_diagnostics([abort], 3, True, float32=True)
    d_in_place = off_policy_diagnostics([in_place], 3, True, float32=True)
    assert d_abort["logprob_mismatch_tokens"] == 5 and d_abort["logprob_mismatch_flagged"] is True
    assert d_in_place["logprob_mismatch_tokens"] == 3 and d_in_place["logprob_mismatch_max"] == 0.0
    assert d_in_place["logprob_mismatch_flagged"] is False


def test_pause_mode_is_checked_with_its_name():
    from areal_cli.config import apply_overrides

    assert apply_overrides(TrainConfig(), ["rollout.pause_mode=in_place"]).rollout.pause_mode == "in_place"
    with pytest.raises(UserError, match="field 'rollout.pause_mode': must be one of abort, in_place"):
        apply_overrides(TrainConfig(), ["rollout.pause_mode=retract"])
    with pytest.raises(UserError, match="pause_mode"):  # a new setting: no flat name of earlier releases
        apply_overrides(TrainConfig(), ["pause_mode=in_place"])
    with pytest.raises(UserError, match="field 'rollout.pause_mode': in_place pauses an interruptible") as e:
        apply_overrides(TrainConfig(), ["rollout.pause_mode=in_place", "rollout.interruptible=false"])
    assert_one_line(str(e.value))
