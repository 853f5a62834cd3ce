"""The RL update on a batch like the loop's: sampled at temperature 1 by the embedded engine from two older
policies (each sample interrupted by a weight update: its first tokens from version 0, the rest from version 1,
the trainer at version 2), rewards per group. The trainer's `train_on_groups` loss is compared with a hand
computation from the decoupled-PPO formula (AReaL boba², eq. 5) on logprobs recomputed by Hugging Face
`transformers` (an independent forward), with and without proximal recomputation."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from areal_cli.api.types import Group, Item, Trajectory
from areal_cli.config import TrainConfig
from areal_cli.models.tiny import build_tiny_model
from areal_cli.rollout.engine import InferenceEngine
from areal_cli.rollout.protocol import SamplingParams
from areal_cli.trainer.megatron_engine import MegatronEngine
from areal_cli.trainer.steps import train_on_groups

REWARDS = ([1.0, 0.0, 0.5], [0.0, 1.0, 1.0])  # two groups of three samples
PROMPTS = ([5, 9, 14, 3], [7, 2, 11])
FIRST, REST = 4, 5  # tokens sampled by version 0, then by version 1 after the "weight update"
EPS_CLIP, CAP = 0.2, 5.0


def _perturbed(base, out, scale, seed):
    build_tiny_model(out, seed=0)  # same tokenizer and config; weights replaced below
    g = torch.Generator().manual_seed(seed)
    sd = load_file(str(base / "model.safetensors"))
    save_file({k: (v + scale * torch.randn(v.shape, generator=g)).contiguous() for k, v in sorted(sd.items())},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("ppo_update")
    current = build_tiny_model(d / "v2", seed=0)  # the trainer's weights
    v0, v1 = _perturbed(current, d / "v0", 0.08, 1), _perturbed(current, d / "v1", 0.04, 2)
    e0, e1 = InferenceEngine(v0, seed=3), InferenceEngine(v1, seed=4)
    groups = []
    for gi, (prompt, rewards) in enumerate(zip(PROMPTS, REWARDS)):
        samples = []
        for j, r in enumerate(rewards):
            a = e0.generate([prompt], SamplingParams(FIRST, temperature=1.0, ignore_eos=True, seed=10 * gi + j))[0]
            b = e1.generate([prompt + a.output_ids],
                            SamplingParams(REST, temperature=1.0, ignore_eos=True, seed=100 + 10 * gi + j))[0]
            samples.append(Trajectory(prompt, a.output_ids + b.output_ids, a.output_logprobs + b.output_logprobs,
                                      [0] * FIRST + [1] * REST, r, gi, "length", n_interruptions=1))
        groups.append(Group(gi, Item(str(gi), prompt, ""), samples))
    return current, groups


def _hf_token_logprobs(model_dir, seq: list[int], n_out: int) -> list[float]:
    """log pi(token_t | prefix) of the last ``n_out`` tokens of ``seq``, float64, by transformers."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    with torch.no_grad():
        lp = torch.log_softmax(m(torch.tensor([seq])).logits[0].double(), -1)
    P = len(seq) - n_out
    return [float(lp[P - 1 + t, seq[P + t]]) for t in range(n_out)]


def _hand_loss(current, groups, recompute_proximal: bool) -> tuple[float, int]:
    """Decoupled PPO (boba² eq. 5) at the first update, where theta = the weights proximal logprobs come from:
    loss = -(1/N) sum_t w_t * min(u_t A_t, clip(u_t, 1-e, 1+e) A_t), u_t = pi_theta / pi_prox, w_t = pi_prox /
    pi_behav (tokens with w_t > cap masked out); GRPO advantages A = (r - mean) / (std + 1e-5) per group."""
    terms, n, capped = [], 0, 0
    for g in groups:
        r = [s.reward for s in g.samples]
        mean = sum(r) / len(r)
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / len(r))
        for s, ri in zip(g.samples, r):
            adv = (ri - mean) / (std + 1e-5)
            cur = _hf_token_logprobs(current, s.prompt_ids + s.output_ids, len(s.output_ids))
            for lp, behav in zip(cur, s.behaviour_logprobs):
                prox = lp if recompute_proximal else behav
                u = math.exp(lp - prox)
                w = math.exp(prox - behav)
                n += 1
                if w > CAP:
                    capped += 1
                    continue
                terms.append(-w * min(u * adv, min(max(u, 1 - EPS_CLIP), 1 + EPS_CLIP) * adv))
    return sum(terms) / n, capped


@pytest.mark.parametrize("recompute_proximal, method", [(True, "recompute"), (True, "reuse"), (False, "auto")])
def test_update_on_a_stale_interrupted_sampled_batch_equals_the_hand_computed_loss(setup, recompute_proximal,
                                                                                    method):
    current, groups = setup
    versions = {v for g in groups for s in g.samples for v in s.versions}
    assert versions == {0, 1}  # stale (trainer at 2) and interrupted (two versions in every sample)
    cfg = TrainConfig().with_values({
        "ppo.adv_norm": "group", "ppo.reward_bias": 0.0, "ppo.reward_scaling": 1.0, "ppo.max_reward_clip": 20.0,
        "ppo.recompute_proximal": recompute_proximal, "rollout.temperature": 1.0, "ppo.max_tokens_per_mb": 0,
        "ppo.n_minibatches": 1, "ppo.eps_clip": EPS_CLIP, "ppo.behav_imp_weight_cap": CAP,
        "ppo.prox_logp_method": method})
    engine = MegatronEngine(current, lr=1e-3, seed=0)
    stats = train_on_groups(engine, groups, cfg, pad_id=0)
    want, capped = _hand_loss(current, groups, recompute_proximal)
    assert stats["loss"] == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert stats["iw_capped_frac"] == pytest.approx(capped / (len(REWARDS) * 3 * (FIRST + REST)))
    assert abs(want) > 1e-3  # a loss that a sign flip or a missing weight would change
    if recompute_proximal:
        # the behaviour policies differ from the proximal one: importance weights are not all 1
        assert stats["clip_frac"] == 0.0  # u = 1 at the first update
    else:
        assert stats["iw_capped_frac"] == 0.0  # w = 1 when proximal := behaviour


@pytest.mark.parametrize("max_tokens_per_mb", [0, 24])
def test_reusing_the_training_forward_as_proximal_policy_is_the_recomputed_update(setup, max_tokens_per_mb):
    """``ppo.prox_logp_method: reuse`` (one forward pass fewer) gives the loss, gradient norm, off-policy
    diagnostics and updated weights of ``recompute``, with one micro-batch and with packed micro-batches."""
    current, groups = setup
    results = {}
    for method in ("recompute", "reuse"):
        cfg = TrainConfig().with_values({
            "ppo.adv_norm": "group", "ppo.reward_bias": 0.0, "ppo.reward_scaling": 1.0, "ppo.max_reward_clip": 20.0,
            "ppo.recompute_proximal": True, "rollout.temperature": 1.0, "ppo.max_tokens_per_mb": max_tokens_per_mb,
            "ppo.n_minibatches": 1, "ppo.eps_clip": EPS_CLIP, "ppo.behav_imp_weight_cap": CAP,
            "ppo.prox_logp_method": method})
        engine = MegatronEngine(current, lr=1e-3, seed=0)
        stats = train_on_groups(engine, groups, cfg, pad_id=0)
        weights = {k: v.detach().clone() for k, v in engine.model.state_dict().items() if torch.is_tensor(v)}
        results[method] = stats, weights
    (a, wa), (b, wb) = results["recompute"], results["reuse"]
    if max_tokens_per_mb:
        assert a["n_micro_batches"] > 1
    for key in ("loss", "grad_norm", "iw_capped_frac", "iw_p50", "iw_p99", "iw_min", "iw_max"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    assert b["clip_frac"] == a["clip_frac"] == 0.0
    changed = max(float((wa[k] - current_w).abs().max()) for k, current_w in
                  MegatronEngine(current, lr=1e-3, seed=0).model.state_dict().items() if k in wa)
    assert changed > 1e-5  # the step moved the weights
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6 * max(changed, 1.0) + 1e-8
