"""PPO with a critic and the entropy term (issue 41): GAE, the clipped value loss and the entropy against numbers
worked out by hand, each with a test-local *mutant* of the central line that the hand numbers reject; the critic on
a real engine (values start at 0, regression moves them to the returns); real ``areal train`` runs with the ``ppo``
preset (critic metrics, the critic in checkpoints and restored on resume, the data-parallel trainer).

Sources: GAE, Schulman et al. 2016 ("High-Dimensional Continuous Control Using Generalized Advantage Estimation",
§3 eq. 16), recursion and masked-position carry of AReaL ``areal/trainer/ppo/actor.py:PPOActor._compute_advantages``;
value loss, AReaL ``areal/utils/functional:ppo_critic_loss_fn`` (mse: max of plain and clipped squared errors);
entropy bonus, verl ``actor.entropy_coeff`` (H of the whole-vocabulary distribution at each position).

GAE hand table (gamma 0.9, lambda 0.5, so gamma * lambda = 0.45):

row 0: loss mask 1 1 1 0, V = 0.5 0.2 -0.4, reward +1 on t = 2
    t=2: delta = 1 + 0 - (-0.4) = 1.4                 A = 1.4              R = A + V = 1.0
    t=1: delta = 0 + 0.9 * (-0.4) - 0.2 = -0.56       A = -0.56 + 0.45 * 1.4 = 0.07       R = 0.27
    t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32          A = -0.32 + 0.45 * 0.07 = -0.2885   R = 0.2115
row 1: loss mask 1 0 1 1 (t = 1 a tool token: skipped, its V = 9 never read), V = 0.1 9 0.3 0.6, reward -1 on t = 3
    t=3: delta = -1 - 0.6 = -1.6                      A = -1.6             R = -1.0
    t=2: delta = 0.9 * 0.6 - 0.3 = 0.24               A = 0.24 - 0.45 * 1.6 = -0.48       R = -0.18
    t=0: delta = 0.9 * 0.3 - 0.1 = 0.17               A = 0.17 - 0.45 * 0.48 = -0.046     R = 0.054

Value loss hand table (eps 0.2, token mean over 3 tokens):

    V     V_old  R     0.5 (V - R)^2   V_clip  0.5 (V_clip - R)^2   max     dloss/dV
    0.3   0.0    1.0   0.245           0.2     0.32                 0.32    0 (clipped branch, V outside +-0.2)
    1.0   0.5    0.0   0.5             0.7     0.245                0.5     (1.0 - 0.0) / 3
    -0.2  0.0    0.1   0.045           -0.2    0.045                0.045   (-0.2 - 0.1) / 3
    loss = (0.32 + 0.5 + 0.045) / 3 = 0.288333

Entropy: logits (0, ln 3) -> p = (1/4, 3/4), H = ln 4 - 3/4 ln 3 = 0.562335; at T = 2 p = (0.366025, 0.633975),
H = 0.656806; dH/dz_i = -p_i (log p_i + H) = (0.205990, -0.205990) at T = 1.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from areal_cli.config import TrainConfig
from areal_cli.foundations.errors import UserError
from areal_cli.trainer.advantages import gae_advantages, last_token_rewards, sequence_rewards
from areal_cli.trainer.critic import value_loss

GAMMA, LAM = 0.9, 0.5
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.float32)
VALUES = torch.tensor([[0.5, 0.2, -0.4, 0.0], [0.1, 9.0, 0.3, 0.6]])
SEQ_REWARDS = torch.tensor([1.0, -1.0])
HAND_ADV = [[-0.2885, 0.07, 1.4, 0.0], [-0.046, 0.0, -0.48, -1.6]]
HAND_RET = [[0.2115, 0.27, 1.0, 0.0], [0.054, 0.0, -0.18, -1.0]]


def _gae_mutant(rewards, values, mask, discount, lam, *, skip_masked=True, gamma_in_trace=True, add_values=True):
    """The GAE recursion with one line changed (the mutants): masked positions not skipped, lambda without gamma
    in the trace, or returns without the values."""
    B, T = rewards.shape
    adv = torch.zeros(B, T, dtype=torch.float64)
    last, nxt = torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    m = mask.bool()
    for t in range(T - 1, -1, -1):
        delta = rewards[:, t] + discount * nxt - values[:, t]
        new = delta + (discount * lam if gamma_in_trace else lam) * last
        mt = m[:, t] if skip_masked else torch.ones(B, dtype=torch.bool)
        last = torch.where(mt, new, last)
        nxt = torch.where(mt, values[:, t].double(), nxt)
        adv[:, t] = torch.where(m[:, t], new, torch.zeros_like(new))
    ret = torch.where(m, adv + values if add_values else adv, torch.zeros_like(adv))
    return adv, ret


def test_last_token_rewards_put_each_reward_on_its_last_loss_token():
    r = last_token_rewards(SEQ_REWARDS, MASK)
    assert r.tolist() == [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, -1.0]]
    assert last_token_rewards(torch.tensor([2.0]), torch.zeros(1, 3)).tolist() == [[0.0, 0.0, 0.0]]


def test_gae_by_hand():
    adv, ret = gae_advantages(last_token_rewards(SEQ_REWARDS, MASK), VALUES, MASK, GAMMA, LAM)
    assert torch.allclose(adv, torch.tensor(HAND_ADV), atol=1e-6)
    assert torch.allclose(ret, torch.tensor(HAND_RET), atol=1e-6)


@pytest.mark.parametrize("mutant", [{"skip_masked": False}, {"gamma_in_trace": False}, {"add_values": False}])
def test_gae_mutants_fail_the_hand_table(mutant):
    adv, ret = _gae_mutant(last_token_rewards(SEQ_REWARDS, MASK).double(), VALUES.double(), MASK, GAMMA, LAM,
                           **mutant)
    assert not (torch.allclose(adv.float(), torch.tensor(HAND_ADV), atol=1e-4)
                and torch.allclose(ret.float(), torch.tensor(HAND_RET), atol=1e-4))


def test_gae_at_gamma_lambda_one_with_zero_values_is_the_outcome_reward_on_every_token():
    """The critic-free path's advantage (GRPO before normalisation) is GAE's special case."""
    adv, ret = gae_advantages(last_token_rewards(SEQ_REWARDS, MASK), torch.zeros(2, 4), MASK, 1.0, 1.0)
    assert adv.tolist() == [[1.0, 1.0, 1.0, 0.0], [-1.0, 0.0, -1.0, -1.0]] and ret.tolist() == adv.tolist()


def test_gae_refuses_bad_arguments():
    with pytest.raises(ValueError, match="discount"):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 1.5, 1.0)
    with pytest.raises(ValueError, match="same"):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), 1.0, 1.0)


V = torch.tensor([[0.3, 1.0, -0.2]])
OLD = torch.tensor([[0.0, 0.5, 0.0]])
RET = torch.tensor([[1.0, 0.0, 0.1]])
VMASK = torch.ones(1, 3, dtype=torch.bool)


def test_value_loss_and_gradient_by_hand():
    v = V.clone().requires_grad_(True)
    loss, st = value_loss(v, OLD, RET, VMASK, 0.2, 3)
    loss.backward()
    assert loss.item() == pytest.approx(0.865 / 3, abs=1e-7)
    assert torch.allclose(v.grad, torch.tensor([[0.0, 1.0 / 3, -0.1]]), atol=1e-7)
    assert st["n_clipped"] == 1.0 and st["n_tokens"] == 3.0
    assert st["sq_err_sum"] == pytest.approx(0.49 + 1.0 + 0.09, abs=1e-6)
    plain, _ = value_loss(V, OLD, RET, VMASK, 0.0, 3)  # eps 0: no clipping
    assert plain.item() == pytest.approx((0.245 + 0.5 + 0.045) / 3, abs=1e-7)


def test_value_loss_mutants_fail_the_hand_table():
    clipped_v = OLD + (V - OLD).clamp(-0.2, 0.2)
    mins = torch.minimum(0.5 * (V - RET) ** 2, 0.5 * (clipped_v - RET) ** 2).sum() / 3  # min instead of max
    around_returns = torch.maximum(0.5 * (V - RET) ** 2,  # clipped around the return instead of the old value
                                   0.5 * (RET + (V - RET).clamp(-0.2, 0.2) - RET) ** 2).sum() / 3
    for m in (mins, around_returns):
        assert abs(m.item() - 0.865 / 3) > 1e-3


def _entropy(logits, temperature, tp=1):
    from areal_cli.trainer.megatron_engine import MegatronEngine

    return MegatronEngine._entropy_from_logits(SimpleNamespace(tp=tp), logits, temperature)


def test_entropy_and_its_gradient_by_hand():
    z = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], requires_grad=True)  # [B=1, L=2, V=2]: one position
    h = _entropy(z, 1.0)
    assert h.shape == (1, 1) and h.item() == pytest.approx(math.log(4) - 0.75 * math.log(3), abs=1e-6)
    h.sum().backward()
    assert torch.allclose(z.grad[0, 0], torch.tensor([0.205990, -0.205990]), atol=1e-5)
    assert _entropy(z.detach(), 2.0).item() == pytest.approx(0.656806, abs=1e-5)
    # mutant: the temperature ignored (H of the unscaled logits) fails the T = 2 value
    lp = torch.log_softmax(z.detach()[:, :-1], -1)
    assert abs(float(-(lp.exp() * lp).sum()) - 0.656806) > 1e-2
    with pytest.raises(NotImplementedError, match="tensor_parallel 1"):
        _entropy(z, 1.0, tp=2)


def test_sequence_rewards_follow_reward_norm_then_adv_norm():
    ppo = TrainConfig().ppo
    shaped, gid = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    ppo.adv_norm = "global"  # the ppo preset: raw rewards into GAE
    assert sequence_rewards(shaped, gid, ppo).tolist() == [1.0, 0.0, 1.0, 1.0]
    ppo.adv_norm = "group"  # unset reward_norm keys follow adv_norm group: GRPO's group normalisation
    got = sequence_rewards(shaped, gid, ppo)
    assert got[0].item() == pytest.approx(0.5 / (0.5 + 1e-5), rel=1e-5) and got[2:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("values,key", [
    ({"ppo.discount": 0.9, "ppo.algorithm": "gspo"}, "ppo.discount"),
    ({"ppo.gae_lambda": -0.1}, "ppo.gae_lambda"),
    ({"ppo.algorithm": "ppo", "ppo.discount": 1.5}, "ppo.discount"),
    ({"ppo.algorithm": "ppo", "critic.n_minibatches": 3}, "critic.n_minibatches"),
    ({"ppo.algorithm": "ppo", "critic.eps_clip": -1.0}, "critic.eps_clip"),
    ({"ppo.algorithm": "ppo", "parallel.pipeline": 2, "sft.max_steps": 0, "model.path": "/m"}, "critic.enabled"),
    ({"ppo.algorithm": "ppo", "ppo.kl_ctl": 0.1}, "ppo.kl_in"),
    ({"critic.enabled": True, "ppo.importance_sampling_level": "sequence",
      "ppo.behav_imp_weight_mode": "sequence_mask"}, "ppo.importance_sampling_level"),
    ({"ppo.entropy_coeff": -0.1}, "ppo.entropy_coeff"),
    ({"ppo.entropy_coeff": 0.01, "parallel.tensor": 2}, "ppo.entropy_coeff"),
])
def test_bad_critic_and_entropy_settings_are_one_line(values, key):
    with pytest.raises(UserError, match=f"field '{key}'") as e:
        TrainConfig().with_values(values).validate()
    assert "\n" not in str(e.value)


def test_discounting_without_a_critic_is_gae_with_values_zero():
    """AReaL without a critic: GAE with V = 0, so A_t = (gamma lambda)^(T-1-t) * the group-normalised reward of
    the sequence; group rewards (1, 0): normalised (1, -1) (x 0.5 / (0.5 + 1e-5)); gamma 0.9, lambda 1, 3 tokens."""
    from areal_cli.api.types import Group, Item, Trajectory
    from areal_cli.trainer.steps import make_train_batch

    g = Group(0, Item("0", [1, 2], ""), [Trajectory([1, 2], [5, 6, 7], [-0.1] * 3, [0] * 3, r, 0, "stop")
                                         for r in (1.0, 0.0)])
    cfg = TrainConfig().with_values({"ppo.discount": 0.9})
    cfg.validate()
    batch = make_train_batch([g], cfg, pad_id=0)
    a = 0.5 / (0.5 + 1e-5)
    m = batch.loss_mask.bool()
    assert batch.advantages[0][m[0]].tolist() == pytest.approx([0.81 * a, 0.9 * a, a], rel=1e-6)
    assert batch.advantages[1][m[1]].tolist() == pytest.approx([-0.81 * a, -0.9 * a, -a], rel=1e-6)
    cfg = TrainConfig()
    cfg.validate()
    assert make_train_batch([g], cfg, pad_id=0).advantages[0][m[0]].tolist() == pytest.approx([a] * 3, rel=1e-6)


@pytest.mark.parametrize("key,value", [("critic.lr", float("nan")), ("critic.lr", float("inf")),
                                       ("ppo.entropy_coeff", float("nan")), ("ppo.kl_ctl", float("inf")),
                                       ("critic.eps_clip", float("nan")), ("ppo.grad_clip", float("nan"))])
def test_nan_and_inf_are_refused_in_one_line(key, value):
    """Found by a stranger's review: range checks like ``x < 0`` let nan through (critic.lr=nan crashed in AdamW
    after the warm start; critic.lr=inf trained to nan metrics)."""
    with pytest.raises(UserError, match=f"field '{key}': must be a finite number") as e:
        TrainConfig().with_values({"critic.enabled": True, key: value}).validate()
    assert "\n" not in str(e.value)


def test_inf_means_no_limit_where_documented():
    cfg = TrainConfig().with_values({"ppo.grad_clip": float("inf"), "ppo.behav_imp_weight_cap": float("inf")})
    cfg.validate()


def test_a_preset_chosen_with_o_replaces_the_recipes_values_of_its_keys():
    """tiny-arith's recipe sets ``ppo.adv_norm: group`` (for its grpo); ``-o ppo.algorithm=ppo`` gets the ppo preset's
    ``global``, unless ``-o`` also sets the key; keys the preset does not set keep the recipe's values."""
    from areal_cli.config import apply_overrides
    from areal_cli.recipes.train_config import load_train_config

    recipe, _ = load_train_config("tiny-arith")
    assert recipe.ppo.adv_norm == "group"
    cfg = apply_overrides(recipe, ["ppo.algorithm=ppo"])
    assert (cfg.critic.enabled, cfg.ppo.adv_norm, cfg.ppo.gae_lambda) == (True, "global", 0.95)
    assert cfg.ppo.lr == recipe.ppo.lr and cfg.ppo.eps_clip == recipe.ppo.eps_clip
    cfg = apply_overrides(recipe, ["ppo.algorithm=ppo", "ppo.adv_norm=group"])
    assert (cfg.critic.enabled, cfg.ppo.adv_norm) == (True, "group")
    cfg = apply_overrides(cfg, ["ppo.algorithm=grpo"])  # and back: the preset's keys return to their defaults
    assert (cfg.critic.enabled, cfg.ppo.gae_lambda) == (False, 1.0)


def test_the_ppo_preset_turns_the_critic_on_and_kl_in_the_loss_combines():
    cfg = TrainConfig().with_values({"ppo.algorithm": "ppo", "ppo.kl_ctl": 0.05, "ppo.kl_in": "loss"})
    cfg.validate()
    assert cfg.critic.enabled and cfg.ppo.gae_lambda == 0.95 and cfg.ppo.adv_norm == "global"
    cfg.ppo.algorithm = "grpo"
    cfg.validate()  # switching back: the preset's keys return to their defaults
    assert not cfg.critic.enabled and cfg.ppo.gae_lambda == 1.0 and cfg.ppo.adv_norm == "group"


# ----------------------------------------------------------------------------- the critic on a real engine
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from areal_cli.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("critic") / "m", seed=0)


def _batch(seed: int = 0):
    from areal_cli.trainer.batch import build_train_batch

    g = torch.Generator().manual_seed(seed)
    rows = []
    for n_prompt, n_out in ((4, 5), (3, 6), (5, 3)):
        ids = torch.randint(3, 200, (n_prompt + n_out,), generator=g).tolist()
        rows.append((ids[:n_prompt], ids[n_prompt:], [-1.0] * n_out, [0] * n_out, None))
    return build_train_batch(rows, pad_id=0)


def test_critic_starts_at_zero_and_regresses_the_returns(tiny):
    from areal_cli.trainer.critic import attach_critic, critic_state, load_critic_state
    from areal_cli.trainer.megatron_engine import MegatronEngine

    engine = MegatronEngine(tiny, lr=1e-3, seed=0)
    rng = torch.get_rng_state()
    attach_critic(engine, lr=1e-2, weight_decay=0.0, grad_clip=1.0, seed=0)
    assert torch.equal(torch.get_rng_state(), rng)  # building the critic leaves the run's RNG alone
    b = _batch()
    v0 = engine.critic.values(b)
    assert v0.shape == b.loss_mask.shape and float(v0.abs().max()) == 0.0  # the zero value head
    adv, ret = gae_advantages(last_token_rewards(torch.tensor([1.0, -1.0, 0.5]), b.loss_mask), v0, b.loss_mask,
                              1.0, 0.95)
    b.values, b.returns = v0.float(), ret
    cfg = TrainConfig().with_values({"ppo.algorithm": "ppo"})
    from areal_cli.trainer.critic import critic_update

    mse = [critic_update(engine, b, cfg)["value_mse"] for _ in range(15)]
    assert mse[0] == pytest.approx(float((ret[b.loss_mask.bool()] ** 2).mean()), rel=1e-5)  # V = 0 at first
    assert mse[-1] < 0.5 * mse[0]
    saved = critic_state(engine)
    v1 = engine.critic.values(b)
    attach_critic(engine, lr=1e-2, weight_decay=0.0, grad_clip=1.0, seed=0)  # a fresh critic ...
    assert float(engine.critic.values(b).abs().max()) == 0.0
    load_critic_state(engine, saved)  # ... and the saved one restored
    assert torch.equal(engine.critic.values(b), v1)
    assert engine.critic.optimizer.state_dict()["state"].keys() == saved["optimizer"]["state"].keys()


def test_entropy_term_enters_the_loss_with_its_sign_and_matches_transformers(tiny):
    """ppo_update with entropy_coeff 0.1 and 0 from the same weights: the losses differ by -0.1 * the token-mean
    entropy, and that entropy is the one Hugging Face transformers computes from its own forward."""
    from transformers import AutoModelForCausalLM

    from areal_cli.trainer.megatron_engine import MegatronEngine
    from areal_cli.trainer.steps import ppo_update

    out = {}
    for coeff in (0.0, 0.1):
        engine = MegatronEngine(tiny, lr=1e-3, seed=0)
        b = _batch()
        b.advantages = b.loss_mask * 0.5
        cfg = TrainConfig().with_values({"ppo.entropy_coeff": coeff})
        cfg.validate()
        out[coeff] = ppo_update(engine, b, cfg)
    ent = out[0.1]["entropy_mean"]
    assert out[0.1]["loss"] - out[0.0]["loss"] == pytest.approx(-0.1 * ent, abs=1e-6)
    b = _batch()
    m = AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float64).eval()
    with torch.no_grad():
        lp = torch.log_softmax(m(b.input_ids).logits[:, :-1].double(), -1)
    h = -(lp.exp() * lp).sum(-1)
    assert ent == pytest.approx(float(h[b.loss_mask.bool()].mean()), abs=1e-4)


# ----------------------------------------------------------------------------- real runs
def _areal(*args, timeout=600):
    areal = Path(sys.executable).parent / "areal"
    return subprocess.run([str(areal), *args], capture_output=True, text=True, timeout=timeout)


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.multiproc
def test_ppo_preset_run_trains_the_critic_checkpoints_it_and_resumes_with_it(tmp_path):
    """tiny-arith with ``ppo.algorithm ppo`` and the entropy term on the data-parallel trainer (2 ranks), 3 steps, a
    checkpoint every step. The first step's values are exactly 0 (the zero value head); resumed from the step-2
    checkpoint, the critic is the checkpoint's (its values at step 3 are not 0, as a fresh critic's would be)."""
    run = tmp_path / "run"
    r = _areal("train", "tiny-arith", "--no-live", "--out", str(run), "-o", "ppo.algorithm=ppo",
               "-o", "ppo.entropy_coeff=0.01", "-o", "loop.max_steps=3", "-o", "loop.checkpoint_every=1",
               "-o", "loop.keep_checkpoints=3", "-o", "parallel.data=2")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = {x["step"]: x for x in _lines(run) if x["step"] > 0}
    assert sorted(lines) == [1, 2, 3]
    assert lines[1]["value_mean"] == 0.0
    for x in lines.values():
        for k in ("value_loss", "critic_grad_norm", "value_clip_frac", "explained_variance", "entropy_mean",
                  "iw_mean"):
            assert isinstance(x[k], float) and math.isfinite(x[k]), k
        assert x["entropy_mean"] > 0 and x["critic_grad_norm"] > 0
    assert lines[3]["value_mean"] != 0.0
    assert (run / "checkpoints" / "step-000002" / "critic.pt").is_file()
    # resume from step 2: the run is made unfinished again, as a kill after the step-2 checkpoint leaves it
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints" / "step-000003")
    r = _areal("train", "--resume", str(run), "--no-live")
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = {x["step"]: x for x in _lines(run) if x["step"] > 0}
    assert sorted(resumed) == [1, 2, 3] and resumed[3].get("resumed_from") is not None
    assert resumed[3]["value_mean"] != 0.0 and math.isfinite(resumed[3]["value_loss"])
