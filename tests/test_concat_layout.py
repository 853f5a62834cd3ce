"""The concatenated layout of a multi-turn / agent trajectory (AReaL's ``export_interactions(style="concat")``):
one sequence per conversation whose environment / tool / template tokens inside the response carry loss mask 0.

- the loss on the generated tokens and its gradient equal the per-turn layout's (each turn its own sample, every
  earlier token a prompt token), computed with a real (tiny) model; masked tokens get no gradient;
- ``build_train_batch`` / ``make_train_batch`` write the mask; bad masks are one clear ValueError;
- head-version / staleness skip version -1;
- the multi-turn workflow's ``layout: concat`` exports one sample per conversation.
"""

from __future__ import annotations

import asyncio
import re

import pytest
import torch

from areal_cli.api.types import Group, Item, Trajectory
from areal_cli.config import TrainConfig
from areal_cli.rollout.controller import _head_version
from areal_cli.trainer.batch import build_train_batch
from areal_cli.trainer.decoupled_ppo import DecoupledPPOConfig, decoupled_ppo_loss
from areal_cli.trainer.steps import make_train_batch

torch.set_num_threads(1)

P = [1, 30, 31, 32, 2, 1, 40]          # the first prompt
O1 = [50, 51, 52, 2]                    # turn 1, generated (version 3)
E = [1, 60, 61, 62, 2, 1, 40]           # feedback / tool result + template: environment tokens
O2 = [70, 71, 2]                        # turn 2, generated (version 4, 5: interrupted by a weight update)
LP1 = [-0.5, -1.0, -0.25, -2.0]
LP2 = [-0.75, -1.5, -0.1]
V1, V2 = [3, 3, 3, 3], [4, 5, 5]


def concat_sample(reward=1.0, gid=0) -> Trajectory:
    out = O1 + E + O2
    return Trajectory(P, out, LP1 + [0.0] * len(E) + LP2, V1 + [-1] * len(E) + V2, reward, gid, "stop",
                      loss_mask=[1] * len(O1) + [0] * len(E) + [1] * len(O2))


def per_turn_samples(reward=1.0, gid=0) -> list[Trajectory]:
    return [Trajectory(P, O1, LP1, V1, reward, gid, "stop"),
            Trajectory(P + O1 + E, O2, LP2, V2, reward, gid, "stop")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from areal_cli.models.tiny import build_tiny_model

    d = build_tiny_model(tmp_path_factory.mktemp("concat") / "m", seed=0)
    return AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float64).eval()


def token_logprobs(model, batch) -> torch.Tensor:
    """[B, L-1]: log pi(input_ids[:, t+1] | prefix), with grad."""
    logits = model(batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    lp = torch.log_softmax(logits[:, :-1].double(), -1)
    return lp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)


def loss_and_grads(model, batch, adv: float):
    model.zero_grad()
    lp = token_logprobs(model, batch)
    lp.retain_grad()
    n = float(batch.loss_mask.sum())
    advantages = adv * batch.loss_mask.double()
    loss, _ = decoupled_ppo_loss(lp, lp.detach() + 0.05 * batch.loss_mask.double(),  # u != 1: the clip matters
                                 batch.behaviour_logprobs.double(), advantages, batch.loss_mask.double(), n,
                                 DecoupledPPOConfig(eps_clip=0.2))
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, lp.grad.detach().clone()


def test_concat_gives_the_per_turn_loss_and_gradient_and_masked_tokens_get_none(model):
    concat = build_train_batch([(s.prompt_ids, s.output_ids, s.behaviour_logprobs, s.versions, s.loss_mask)
                                for s in [concat_sample()]])
    turns = build_train_batch([(s.prompt_ids, s.output_ids, s.behaviour_logprobs, s.versions)
                               for s in per_turn_samples()])
    # the batch: mask 1 exactly on the generated tokens, 0 / logprob 0 / version -1 on the environment ones
    n_p = len(P)
    expect_mask = [0.0] * (n_p - 1) + [1.0] * len(O1) + [0.0] * len(E) + [1.0] * len(O2)
    assert concat.loss_mask[0].tolist() == expect_mask
    env = slice(n_p - 1 + len(O1), n_p - 1 + len(O1) + len(E))
    assert concat.versions[0, env].tolist() == [-1] * len(E) and concat.behaviour_logprobs[0, env].abs().sum() == 0
    assert concat.n_loss_tokens == turns.n_loss_tokens == len(O1) + len(O2)

    loss_c, grads_c, lp_grad = loss_and_grads(model, concat, adv=0.7)
    loss_t, grads_t, _ = loss_and_grads(model, turns, adv=0.7)
    assert loss_c == pytest.approx(loss_t, abs=1e-10) and loss_c != 0.0
    for k in grads_t:
        assert torch.allclose(grads_c[k], grads_t[k], atol=1e-10), k
    # no gradient flows through a masked (environment) position, nor through the prompt
    assert lp_grad[0, env].abs().max() == 0 and lp_grad[0, : n_p - 1].abs().max() == 0
    assert lp_grad[0, n_p - 1: n_p - 1 + len(O1)].abs().min() > 0


def test_make_train_batch_writes_the_mask_and_zero_advantages_on_environment_tokens():
    cfg = TrainConfig().with_values({"ppo.adv_norm": "group", "ppo.reward_bias": 0.0, "ppo.reward_scaling": 1.0,
                                     "ppo.max_reward_clip": 0.0})
    groups = [Group(0, Item("q", P, ""), [concat_sample(1.0), concat_sample(0.0)])]
    batch = make_train_batch(groups, cfg, pad_id=0)
    n_p = len(P)
    env = slice(n_p - 1 + len(O1), n_p - 1 + len(O1) + len(E))
    assert batch.loss_mask[:, env].abs().sum() == 0 and batch.advantages[:, env].abs().sum() == 0
    assert batch.advantages[0, n_p - 1] > 0 > batch.advantages[1, n_p - 1]
    assert batch.n_loss_tokens == 2 * (len(O1) + len(O2))


@pytest.mark.parametrize("mask, lp, ver, match", [
    ([1, 0], [-0.1, 0.0, -0.2], [0, -1, 0], "loss_mask has 2 entries for 3 output tokens"),
    ([1, 0, 1], [-0.1, 0.0, -0.2], [0, 2, 0], "output token 1 is masked .* version 2"),
    ([1, 0, 1], [-0.1, -0.3, -0.2], [0, -1, 0], "output token 1 is masked .* logprob -0.3"),
    ([1, 2, 1], [-0.1, 0.0, -0.2], [0, -1, 0], r"loss_mask\[1\] = 2 is not 0 or 1"),
])
def test_bad_masks_are_a_clear_value_error(mask, lp, ver, match):
    with pytest.raises(ValueError, match="sample 0: " + match):
        build_train_batch([([1, 2], [5, 6, 7], lp, ver, mask)])
    t = Trajectory([1, 2], [5, 6, 7], lp, ver, 1.0, 0, "stop", loss_mask=mask)
    assert t.check() is not None and re.search(match, t.check())


def test_head_version_and_staleness_skip_environment_tokens():
    s = concat_sample()
    assert s.head_version == 3 and s.check() is None
    g = Group(0, Item("q", P, ""), [s])
    assert _head_version(g) == 3
    assert Trajectory([1], [2], [0.0], [-1], 0.0, 0, "stop", loss_mask=[0]).head_version == -1


def test_multi_turn_workflow_concat_layout_gives_one_masked_sample_per_conversation(tmp_path):
    from helpers.scripted import ScriptedEngine, episode_client, ids_of, item_of

    from areal_cli.foundations.errors import UserError
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer
    from areal_cli.workflows.multi_turn import MultiTurnWorkflow

    tok = load_tokenizer(build_tiny_model(tmp_path / "m"))
    eos = tok.eos_token_id
    engine = ScriptedEngine([ids_of(tok, "4", "5") + [eos], ids_of(tok, "3", "2", "1") + [eos]])
    client, _ = episode_client(engine, tok, lambda text, k, f: float(text.strip() == "321"), group_size=2)
    wf = MultiTurnWorkflow(max_turns=3, layout="concat")
    group = asyncio.run(wf.arun_episode(client, item_of(tok)))
    assert len(group.samples) == 2  # one per conversation, not one per turn
    for s in group.samples:
        assert s.check() is None and s.reward == pytest.approx(0.9)
        assert s.prompt_ids == engine.prompts[0]
        assert s.prompt_ids + s.output_ids == engine.prompts[1] + ids_of(tok, "3", "2", "1") + [eos]
        gen = [i for i, m in enumerate(s.loss_mask) if m]
        assert [s.output_ids[i] for i in gen] == ids_of(tok, "4", "5") + [eos] + ids_of(tok, "3", "2", "1") + [eos]
        assert [s.versions[i] for i in gen] == [3] * 3 + [4] * 4
    with pytest.raises(UserError, match="workflow_args.layout"):
        MultiTurnWorkflow(layout="concat", reward_mode="per_turn", stop_on_success=False)
    with pytest.raises(UserError, match="workflow_args.layout"):
        MultiTurnWorkflow(layout="flat")
