"""KL to a frozen reference (issue 41: ``ppo.kl_ctl``, ``ppo.kl_estimator``, ``ppo.kl_in``), against numbers worked
out by hand, each with a test-local *mutant* of the central line that the hand numbers reject.

Sources: Schulman, "Approximating KL Divergence" (2020), with x ~ pi_theta and r = pi_ref / pi_theta:
k1 = -log r, k2 = (log r)^2 / 2, k3 = (r - 1) - log r; the sign convention of verl
``verl/trainer/ppo/core_algos.py:kl_penalty_forward(logprob, ref_logprob)`` (k1 = logprob - ref_logprob);
KL in the reward as AReaL ``PPOActor.compute_advantages`` (reward -kl_ctl * k per token, GAE with gamma = lambda = 1
and no critic: the return-to-go), KL in the loss as verl ``use_kl_loss`` (kl_loss_coef * agg_loss(k)).

The batch: 2 rows x 3 tokens, row 1's last token is padding (mask 0). Probabilities
pi_theta = (0.5, 0.25, 0.8 | 0.4, 0.4, -), pi_ref = (0.25, 0.5, 0.2 | 0.2, 0.8, -), so
d = log pi_theta - log pi_ref = (ln 2, -ln 2, ln 4 | ln 2, -ln 2) and r = (0.5, 2, 0.25 | 0.5, 2).

======  ==============================================  ================
token   k1 = d     k2 = d^2/2    k3 = r - 1 - log r      d k3 / d lp = 1 - r
======  ==============================================  ================
0.5/.25  0.693147   0.240227      0.193147                 0.5
.25/0.5 -0.693147   0.240227      0.306853                -1.0
0.8/0.2  1.386294   0.960906      0.636294                 0.75
0.4/0.2  0.693147   0.240227      0.193147                 0.5
0.4/0.8 -0.693147   0.240227      0.306853                -1.0
mean     0.277259   0.384362      0.327259
======  ==============================================  ================
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_cli.config import TrainConfig
from areal_cli.foundations.errors import UserError
from areal_cli.trainer.kl import (freeze_reference, kl_estimate, kl_loss, kl_reward_to_go, kl_sum,
                                  reference_logprobs)

PI = torch.tensor([[0.5, 0.25, 0.8], [0.4, 0.4, 1.0]], dtype=torch.float64)
REF = torch.tensor([[0.25, 0.5, 0.2], [0.2, 0.8, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
LN2 = math.log(2.0)

HAND = {  # per loss token (row 0, then row 1's two), from the table above
    "k1": [LN2, -LN2, 2 * LN2, LN2, -LN2],
    "k2": [LN2 ** 2 / 2, LN2 ** 2 / 2, 2 * LN2 ** 2, LN2 ** 2 / 2, LN2 ** 2 / 2],
    "k3": [0.5 - 1 + LN2, 2 - 1 - LN2, 0.25 - 1 + 2 * LN2, 0.5 - 1 + LN2, 2 - 1 - LN2],
}
HAND_MEAN = {"k1": 0.277259, "k2": 0.384362, "k3": 0.327259}
HAND_GRAD = {  # d (0.1 * token-mean of k) / d lp = 0.1 / 5 * dk/dlp: 1, d, 1 - r
    "k1": [0.02] * 5,
    "k2": [0.02 * LN2, -0.02 * LN2, 0.04 * LN2, 0.02 * LN2, -0.02 * LN2],
    "k3": [0.01, -0.02, 0.015, 0.01, -0.02],
}


def _k3_swapped(lp, ref, estimator):  # mutant: the ratio taken the other way round, r := pi_theta / pi_ref
    d = lp - ref.detach()
    return d.exp() - 1.0 - d


def _k2_no_half(lp, ref, estimator):  # mutant: k2 without the 1/2
    return (lp - ref.detach()).square()


def _k1_reversed(lp, ref, estimator):  # mutant: k1 = log r (the sign flipped)
    return ref.detach() - lp


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_estimators_match_the_hand_table(estimator):
    k = kl_estimate(PI.log(), REF.log(), estimator)
    assert k[MASK].tolist() == pytest.approx(HAND[estimator], abs=1e-6)
    assert kl_sum(PI.log(), REF.log(), MASK, estimator) / 5 == pytest.approx(HAND_MEAN[estimator], abs=1e-6)


@pytest.mark.parametrize("estimator,mutant", [("k1", _k1_reversed), ("k2", _k2_no_half), ("k3", _k3_swapped)])
def test_estimator_mutants_fail_the_hand_table(estimator, mutant):
    k = mutant(PI.log(), REF.log(), estimator)
    assert k[MASK].tolist() != pytest.approx(HAND[estimator], abs=1e-3)


def _loss_grad(estimator, estimate=None):
    """(loss, d loss / d lp) of kl_loss with kl_ctl 0.1, token-mean over the 5 loss tokens (autograd)."""
    lp = PI.log().clone().requires_grad_(True)
    if estimate is None:
        loss = kl_loss(lp, REF.log(), MASK, 0.1, estimator, "token-mean", 5)
    else:
        loss = (0.1 * torch.where(MASK, estimate(lp, REF.log(), estimator), torch.zeros_like(lp))).sum() / 5
    loss.backward()
    return float(loss.detach()), lp.grad


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_loss_kl_gradient_is_the_hand_gradient(estimator):
    loss, grad = _loss_grad(estimator)
    assert loss == pytest.approx(0.1 * HAND_MEAN[estimator], abs=1e-6)
    assert grad[MASK].tolist() == pytest.approx(HAND_GRAD[estimator], abs=1e-9)
    assert float(grad[1, 2]) == 0.0  # padding gets no gradient


@pytest.mark.parametrize("estimator,mutant", [("k1", _k1_reversed), ("k2", _k2_no_half), ("k3", _k3_swapped)])
def test_loss_kl_gradient_mutants_fail(estimator, mutant):
    _, grad = _loss_grad(estimator, mutant)
    assert grad[MASK].tolist() != pytest.approx(HAND_GRAD[estimator], abs=1e-4)


# Reward path, kl_ctl 0.1, k1: per-token rewards -0.1 * d = (-0.0693147, +0.0693147, -0.1386294 | -0.0693147,
# +0.0693147); return-to-go (sum over s >= t of the same sequence): (-0.1386294, -0.0693147, -0.1386294 | 0, +0.0693147).
# With sample advantages +1 (row 0) and -0.5 (row 1) the token advantages become
# (0.8613706, 0.9306853, 0.8613706 | -0.5, -0.4306853, 0 on padding).
HAND_RTG = [[-2 * LN2 / 10, -LN2 / 10, -2 * LN2 / 10], [0.0, LN2 / 10, 0.0]]
HAND_ADV = [[1 - 0.2 * LN2, 1 - 0.1 * LN2, 1 - 0.2 * LN2], [-0.5, -0.5 + 0.1 * LN2, 0.0]]


def _rtg_forward_cumsum(old, ref, mask, kl_ctl, estimator, sequence_ids=None):  # mutant: sum over s <= t
    r = torch.where(mask, -kl_ctl * kl_estimate(old, ref, estimator), torch.zeros_like(old))
    return torch.where(mask, r.cumsum(1), torch.zeros_like(r))


def _rtg_plus_sign(old, ref, mask, kl_ctl, estimator, sequence_ids=None):  # mutant: KL rewarded, not penalised
    return -kl_reward_to_go(old, ref, mask, kl_ctl, estimator, sequence_ids)


def _rtg_reversed_ratio(old, ref, mask, kl_ctl, estimator, sequence_ids=None):  # mutant: k1 = log r
    return kl_reward_to_go(ref, old, mask, kl_ctl, estimator, sequence_ids)


def test_reward_kl_shapes_token_advantages_as_by_hand():
    rtg = kl_reward_to_go(PI.log(), REF.log(), MASK, 0.1, "k1")
    assert rtg.tolist()[0] == pytest.approx(HAND_RTG[0], abs=1e-9)
    assert rtg.tolist()[1] == pytest.approx(HAND_RTG[1], abs=1e-9)
    adv = torch.tensor([[1.0] * 3, [-0.5, -0.5, 0.0]], dtype=torch.float64) + rtg
    assert adv.tolist()[0] == pytest.approx(HAND_ADV[0], abs=1e-9)
    assert adv.tolist()[1] == pytest.approx(HAND_ADV[1], abs=1e-9)


@pytest.mark.parametrize("mutant", [_rtg_forward_cumsum, _rtg_plus_sign, _rtg_reversed_ratio])
def test_reward_kl_mutants_fail(mutant):
    rtg = mutant(PI.log(), REF.log(), MASK, 0.1, "k1")
    assert rtg.flatten().tolist() != pytest.approx([x for row in HAND_RTG for x in row], abs=1e-4)


def test_reward_kl_stays_within_each_packed_sequence():
    """Row 1 then row 0 packed end to end in one row (segments 0, 1, then one padding token, segment -1): the
    return-to-go is each sequence's own; summing over the whole row (the mutant) leaks row 0's KL into row 1."""
    lp = torch.tensor([[0.4, 0.4, 0.5, 0.25, 0.8, 1.0]], dtype=torch.float64).log()
    ref = torch.tensor([[0.2, 0.8, 0.25, 0.5, 0.2, 1.0]], dtype=torch.float64).log()
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    seg = torch.tensor([[0, 0, 1, 1, 1, -1]])
    want = [HAND_RTG[1][0], HAND_RTG[1][1], *HAND_RTG[0], 0.0]
    assert kl_reward_to_go(lp, ref, mask, 0.1, "k1", seg)[0].tolist() == pytest.approx(want, abs=1e-9)
    assert kl_reward_to_go(lp, ref, mask, 0.1, "k1", None)[0].tolist() != pytest.approx(want, abs=1e-4)


def test_discounted_reward_kl_by_hand():
    """GAE with values 0 and discount * gae_lambda = 0.5 (``ppo.discount`` < 1 without a critic): per-token KL rewards
    r = -0.1 k1 = (-0.1 ln2, 0.1 ln2, -0.2 ln2 | -0.1 ln2, 0.1 ln2): row 0 from the end -0.2 ln2, 0.1 ln2 - 0.1 ln2 = 0,
    -0.1 ln2 + 0 = -0.1 ln2; row 1: 0.1 ln2, -0.1 ln2 + 0.05 ln2 = -0.05 ln2. Packed (row 1 then row 0 in one row) the
    carry restarts at the segment boundary; the mutant without segments carries row 0's first reward into row 1."""
    want = [[-0.1 * LN2, 0.0, -0.2 * LN2], [-0.05 * LN2, 0.1 * LN2, 0.0]]
    got = kl_reward_to_go(PI.log(), REF.log(), MASK, 0.1, "k1", discount=0.5)
    assert got.tolist()[0] == pytest.approx(want[0], abs=1e-9) and got.tolist()[1] == pytest.approx(want[1], abs=1e-9)
    lp = torch.tensor([[0.4, 0.4, 0.5, 0.25, 0.8, 1.0]], dtype=torch.float64).log()
    ref = torch.tensor([[0.2, 0.8, 0.25, 0.5, 0.2, 1.0]], dtype=torch.float64).log()
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    seg = torch.tensor([[0, 0, 1, 1, 1, -1]])
    packed = [want[1][0], want[1][1], *want[0], 0.0]
    assert kl_reward_to_go(lp, ref, mask, 0.1, "k1", seg, 0.5)[0].tolist() == pytest.approx(packed, abs=1e-9)
    assert kl_reward_to_go(lp, ref, mask, 0.1, "k1", None, 0.5)[0].tolist() != pytest.approx(packed, abs=1e-4)


class _Engine:
    """A trainer double: one parameter, ``logprobs`` = that parameter; ``load_hf`` sets it from a dict."""

    def __init__(self):
        self.model = torch.nn.Linear(2, 1, bias=False)
        self.dirs = {}

    def logprobs(self, batch, temperature=1.0):
        return self.model.weight.detach().clone()

    def load_hf(self, d):
        with torch.no_grad():
            self.model.weight.copy_(self.dirs[str(d)])


def test_reference_is_frozen_and_swapped_back():
    e = _Engine()
    with torch.no_grad():
        e.model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    freeze_reference(e)
    with torch.no_grad():
        e.model.weight.add_(10.0)  # the policy moves on
    weight = e.model.weight
    assert reference_logprobs(e, None, 1.0).tolist() == [[1.0, 2.0]]
    assert e.model.weight is weight and e.model.weight.tolist() == [[11.0, 12.0]]  # the policy is back
    e.dirs["ref"] = torch.tensor([[5.0, 6.0]])  # resume: the reference reloaded from its folder
    freeze_reference(e, "ref")
    assert reference_logprobs(e, None, 1.0).tolist() == [[5.0, 6.0]]
    assert e.model.weight.tolist() == [[11.0, 12.0]]


@pytest.mark.parametrize("values,key", [
    ({"ppo.kl_ctl": -0.1}, "ppo.kl_ctl"),
])
def test_bad_kl_settings_are_one_line(values, key):
    with pytest.raises(UserError, match=f"field '{key}'") as e:
        TrainConfig().with_values(values).validate()
    assert "\n" not in str(e.value)


@pytest.mark.multiproc
def test_real_run_kl_is_zero_at_the_first_step_and_positive_after(tmp_path):
    """kl_ctl 0.1 (k3, in the reward) on tiny-arith: at step 1 the policy is the reference (kl_mean 0 within 1e-6,
    though the trainer computes the two in separate forwards), at step 2 it has moved (kl_mean > 0). k3, as k1's
    token mean can be negative: its tokens come from the behaviour policy (with eta > 0 often the reference itself),
    not from pi_prox, and E_{x ~ pi_ref}[log pi_prox - log pi_ref] = -KL(pi_ref || pi_prox) < 0. On the
    tensor-parallel trainer (2 ranks, each keeping its shard of the reference); the one-process trainer's run is
    test_resumed_run_keeps_the_runs_initial_policy_as_reference."""
    areal = Path(sys.executable).parent / "areal"
    out = tmp_path / "run"
    r = subprocess.run([str(areal), "train", "tiny-arith", "--no-live", "--out", str(out), "-o", "ppo.kl_ctl=0.1",
                        "-o", "ppo.kl_estimator=k3", "-o", "loop.max_steps=2", "-o", "parallel.tensor=2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    kl = {x["step"]: x["kl_mean"] for x in lines if "kl_mean" in x}
    assert sorted(kl) == [1, 2]
    assert abs(kl[1]) < 1e-6
    assert kl[2] > 0


@pytest.mark.multiproc
def test_resumed_run_keeps_the_runs_initial_policy_as_reference(tmp_path):
    """kl_ctl 0.1 (k3), 3 steps, a checkpoint every step; resumed from step 2, the reference is reloaded from
    RUN/reference (the run's initial policy), not frozen anew from the resumed weights: step 3's kl_mean is then
    > 0 (a reference re-frozen at the resume would be pi_prox itself, kl_mean 0)."""
    import shutil

    areal = Path(sys.executable).parent / "areal"
    out = tmp_path / "run"
    r = subprocess.run([str(areal), "train", "tiny-arith", "--no-live", "--out", str(out), "-o", "ppo.kl_ctl=0.1",
                        "-o", "ppo.kl_estimator=k3", "-o", "loop.max_steps=3", "-o", "loop.checkpoint_every=1",
                        "-o", "loop.keep_checkpoints=3"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "reference" / "config.json").is_file()
    (out / "summary.json").unlink()  # unfinished again, as a kill after the step-2 checkpoint leaves it
    shutil.rmtree(out / "checkpoints" / "step-000003")
    r = subprocess.run([str(areal), "train", "--resume", str(out), "--no-live"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    kl = {x["step"]: x["kl_mean"] for x in lines if "kl_mean" in x}
    assert sorted(kl) == [1, 2, 3] and abs(kl[1]) < 1e-6
    assert kl[3] > 1e-6 and [x for x in lines if x["step"] == 3][0].get("resumed_from") is not None
