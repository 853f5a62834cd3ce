"""Multi-turn RL: AReaL's multi-turn workflow (answer, be scored, get feedback, try again) over a token-exact
conversation (:mod:`areal_cli.workflows.conversation`).

One episode (:meth:`MultiTurnWorkflow.arun_episode`) = ``rollout.group_size`` independent conversations on one prompt.
Each conversation (:class:`Conversation`) runs up to ``max_turns`` turns:

1. the model answers ``Conversation.ids`` (the whole conversation so far, sent as token ids);
2. the task's reward function scores the answer (the reward pool, as in the single-turn workflow);
3. a correct answer (reward > 0) ends the conversation; after a wrong one the feedback turn is appended --
   the end-of-turn token when the model did not produce it, then the chat template's ids of a user message
   holding ``feedback`` and of the next generation prompt (:func:`template_suffix_ids`) -- and the model
   tries again.

Token-exactness: :mod:`areal_cli.workflows.conversation` (:class:`Conversation`, :func:`template_suffix_ids`).

Rewards (two rules, ``reward_mode``):

- ``final`` (default; AReaL ``areal/workflow/multi_turn.py`` ``MultiTurnWorkflow``, AP@HEAD, fixed in v0.5.0
  after v0.4.0 applied the discount twice): the conversation stops at the first turn whose reward is > 0 (or
  at ``max_turns``) and every turn of it gets ``r_T * turn_discount^(T-1)``, ``T`` = turns taken, ``r_T`` the
  reward of the last one (:func:`final_reward`).
- ``per_turn`` (boba²'s ``MathMultiTurnAgent``, IA@v0.3.0 ``realhf/impl/agent/math_multi_turn_agent.py``):
  each turn's own reward, shaped ``(r_t + turn_reward_bias) * turn_reward_scaling``, then discounted returns
  ``G_t = r'_t + turn_discount * G_{t+1}`` (:func:`per_turn_returns`); turn ``t`` is trained with ``G_t``.
  boba² always ran every turn (``stop_on_success: false``, a congratulation as the feedback after a correct
  answer) with ``((s - 0.5) * 2 - b) * c`` rewards, i.e. ``turn_reward_bias = -0.5 - b/2``,
  ``turn_reward_scaling = 2c`` here (:class:`Boba2MathMultiTurnAgent`).

Layout for the trainer: one :class:`~areal_cli.api.types.Trajectory` per TURN (boba²'s layout: "one sequence per
turn; each sequence is the whole context so far plus that turn's output; ``prompt_mask`` covers all earlier
tokens"): the prompt of turn ``t`` is ``Conversation.ids`` up to its first generated token, so every earlier
token -- prompt, earlier answers, feedback and template -- is a prompt token of that sample (loss mask 0,
logprob 0, version -1 in the trainer's batch) and each generated token is trained exactly once, in its own
turn. Under causal attention the logprobs of a turn's tokens are the same as in AReaL's one concatenated
sequence with a loss mask over every assistant turn, so the loss (a sum over the same loss tokens) is the same up
to the advantage statistics -- group normalisation runs over turns, not conversations -- and to the
sequence-level off-policy corrections (``ppo.behav_imp_weight_mode: sequence_*`` see a turn as the sequence); it
costs a re-read of the earlier turns per turn.
(The concatenated form, ``layout: concat``: one sample per conversation, :meth:`Conversation.concat_trajectory`,
with a per-token loss mask whose zeros cover the feedback and template tokens inside the response; only with
``reward_mode: final``, where every turn has the same reward.)

Scoring (held-out evaluation, :attr:`EpisodeClient.evaluating`): one trajectory per conversation -- its last
turn -- with reward :func:`success_reward` (> 0 iff some turn succeeded), so the loop's held-out accuracy is
the accuracy within ``max_turns``; :func:`turn_accuracy` also gives the first-try accuracy.

Everything here speaks token ids and the reward-function contract only, so an OpenAI-compatible front end
(chat messages in, a :class:`Conversation` per session) and tool turns (a tool message rendered by
:func:`template_suffix_ids` like the feedback) can build on it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from areal_cli.api.types import ConversationOutcome, Group, Item, RewardFailed, Trajectory, gather_runs
from areal_cli.foundations.errors import UserError
from areal_cli.workflows.conversation import Conversation, template_suffix_ids, turn_end_token_of

#: Default feedback after a wrong answer (a workflow argument, ``feedback``).
FEEDBACK = "Wrong. Try again."
#: Default feedback after a right answer when conversations go on (``stop_on_success: false``).
SUCCESS_FEEDBACK = "Correct."
REWARD_MODES = ("final", "per_turn")
EVAL_EXPORTS = ("episode", "turns")
#: Training layouts: one sample per turn (boba²) or one concatenated sample per conversation (AReaL).
LAYOUTS = ("per_turn", "concat")


# --------------------------------------------------------------------------------------------------
# Reward rules
# --------------------------------------------------------------------------------------------------
def final_reward(turn_rewards: Sequence[float], turn_discount: float) -> float:
    """AReaL's multi-turn reward: ``r_T * turn_discount^(T-1)``, ``T = len(turn_rewards)`` (the conversation
    stopped at its first success or at ``max_turns``), ``r_T`` the last turn's reward.

    Source: AP@HEAD ``areal/workflow/multi_turn.py`` (``reward * discount`` with ``discount *= turn_discount``
    per extra turn). E.g. rewards ``[0, 0, 1]`` with discount 0.9 -> 0.81.
    Raises:
        ValueError: no turn.
    """
    if not turn_rewards:
        raise ValueError("no turn was scored")
    return float(turn_rewards[-1]) * float(turn_discount) ** (len(turn_rewards) - 1)


def per_turn_returns(turn_rewards: Sequence[float], turn_discount: float, bias: float = 0.0,
                     scaling: float = 1.0) -> list[float]:
    """boba²'s per-turn rewards: shape each ``r'_t = (r_t + bias) * scaling``, then discounted returns backward,
    ``G_t = r'_t + turn_discount * G_{t+1}`` (IA@v0.3.0 ``realhf/impl/agent/math_multi_turn_agent.py``:
    ``all_rewards[i] += all_rewards[i + 1] * turn_level_discount``; its shaping ``((s - 0.5) * 2 - b) * c`` is
    ``bias = -0.5 - b/2``, ``scaling = 2c``). E.g. ``[0, 1]``, discount 0.9, bias -0.5, scaling 2 -> ``[-0.1, 1]``.

    Returns:
        list[float], one return per turn.
    """
    shaped = [(float(r) + float(bias)) * float(scaling) for r in turn_rewards]
    out = list(shaped)
    for i in reversed(range(len(out) - 1)):
        out[i] = out[i] + float(turn_discount) * out[i + 1]
    return out


def success_reward(conv: Conversation, turn_discount: float) -> float:
    """A conversation's score for evaluation: ``r_t * turn_discount^t`` at its first success ``t`` (0-based,
    so the ``final`` rule of that turn), else 0.0 -- > 0 iff some turn within ``max_turns`` was right."""
    t = conv.first_success
    if t is None:
        return 0.0
    return float(conv.turns[t].reward) * float(turn_discount) ** t


# --------------------------------------------------------------------------------------------------
# The workflow
# --------------------------------------------------------------------------------------------------
def _bad(name: str, why: str, value: Any) -> UserError:
    return UserError(f"field 'task.workflow_args.{name}': {why} (got {value!r})")


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(name, "must be a finite number", value)
    return float(value)


#: Turns per conversation accepted (each one appends feedback and an answer to the context; boba2 used 5).
MAX_TURNS_LIMIT = 64


def _positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(name, "must be an integer >= 1" + (" or null" if allow_none else ""), value)
    return int(value)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(name, "must be a non-empty string", value)
    return value


class MultiTurnWorkflow:
    """``async arun_episode(client, item) -> Group``: ``rollout.group_size`` conversations of up to ``max_turns`` turns
    (module docstring: data flow, token-exactness, reward rules, layout).

    Args:
        max_turns: answers per conversation, >= 1 (AReaL ``max_turns``; 1 = the single-turn workflow).
        turn_discount: in (0, 1] (AReaL ``turn_discount``; its multi_turn_math example hard-codes 0.9).
        feedback: the user message after a wrong answer (rendered by the model's chat template).
        reward_mode: ``"final"`` (AReaL) or ``"per_turn"`` (boba²'s per-turn discounted returns).
        stop_on_success: end a conversation at its first right answer (AReaL; ``final`` requires it). boba²
            ran all turns: ``false``, with ``success_feedback`` after a right answer.
        success_feedback: the user message after a right answer when conversations go on.
        turn_reward_bias: ``per_turn`` shaping: added to each turn's reward, before the scaling and the discount
            (``(r + turn_reward_bias) * turn_reward_scaling``).
        turn_reward_scaling: ``per_turn`` shaping: multiplies each turn's biased reward, before the discount.
        n_samples: conversations per prompt (default: the run's ``rollout.group_size``).
        max_new_tokens: generation budget of EACH turn (default: the run's ``rollout.max_new_tokens``).
        max_total_tokens: cap on a conversation's length in tokens (prompt + every turn + template ids), e.g. the
            servers' context length: a turn's budget is cut to the room left, and a conversation with no room for
            another turn ends there (AReaL's ``ArealOpenAI(engine_max_tokens)`` rule); None: no cap (then the
            servers' context must hold ``P + max_turns * (max_new_tokens + template ids)``).
        turn_end_token: the token ending an assistant turn (default: the tokenizer's eos token); appended as a
            template token when a turn ends without it (budget exhausted), as AReaL does.
        eval_export: what a held-out evaluation gets: ``"episode"`` (one sample per conversation, reward
            :func:`success_reward`: accuracy within ``max_turns``) or ``"turns"`` (as in training).
        layout: ``"per_turn"`` (default; one sample per turn, boba²) or ``"concat"`` (one sample per conversation
            with a per-token loss mask, AReaL's ``MultiTurnWorkflow`` / ``export_interactions(style="concat")``;
            needs ``reward_mode: final``).
    Raises:
        UserError: one line naming the bad argument (``field 'task.workflow_args.max_turns': ...``).
    """

    def __init__(self, max_turns: int = 2, turn_discount: float = 0.9, feedback: str = FEEDBACK,
                 reward_mode: str = "final", stop_on_success: bool = True, success_feedback: str = SUCCESS_FEEDBACK,
                 turn_reward_bias: float = 0.0, turn_reward_scaling: float = 1.0, n_samples: int | None = None,
                 max_new_tokens: int | None = None, turn_end_token: str | None = None,
                 eval_export: str = "episode", max_total_tokens: int | None = None,
                 layout: str = "per_turn") -> None:
        self.max_turns = _positive_int("max_turns", max_turns)
        if self.max_turns > MAX_TURNS_LIMIT:  # every turn adds feedback and an answer to the context: a run with
            raise _bad("max_turns", f"must be <= {MAX_TURNS_LIMIT} (boba2's agent used 5)", max_turns)  # more stalls
        self.turn_discount = _number("turn_discount", turn_discount)
        if not 0.0 < self.turn_discount <= 1.0:
            raise _bad("turn_discount", "must be in (0, 1]", turn_discount)
        self.feedback = _text("feedback", feedback)
        self.success_feedback = _text("success_feedback", success_feedback)
        if reward_mode not in REWARD_MODES:
            raise _bad("reward_mode", f"must be one of {', '.join(REWARD_MODES)}", reward_mode)
        self.reward_mode = reward_mode
        if not isinstance(stop_on_success, bool):
            raise _bad("stop_on_success", "must be true or false", stop_on_success)
        if reward_mode == "final" and not stop_on_success:
            raise _bad("stop_on_success", "reward_mode 'final' ends a conversation at its first success (AReaL); "
                                          "running every turn needs reward_mode 'per_turn'", stop_on_success)
        self.stop_on_success = stop_on_success
        self.turn_reward_bias = _number("turn_reward_bias", turn_reward_bias)
        self.turn_reward_scaling = _number("turn_reward_scaling", turn_reward_scaling)
        self.n_samples = _positive_int("n_samples", n_samples, allow_none=True)
        self.max_new_tokens = _positive_int("max_new_tokens", max_new_tokens, allow_none=True)
        self.max_total_tokens = _positive_int("max_total_tokens", max_total_tokens, allow_none=True)
        if turn_end_token is not None:
            _text("turn_end_token", turn_end_token)
        self.turn_end_token = turn_end_token
        if eval_export not in EVAL_EXPORTS:
            raise _bad("eval_export", f"must be one of {', '.join(EVAL_EXPORTS)}", eval_export)
        self.eval_export = eval_export
        if layout not in LAYOUTS:
            raise _bad("layout", f"must be one of {', '.join(LAYOUTS)}", layout)
        if layout == "concat" and reward_mode != "final":
            raise _bad("layout", "'concat' trains one sample per conversation with one reward, so it needs "
                                 "reward_mode 'final'", layout)
        self.layout = layout
        self._suffixes: dict[tuple[int, str], tuple[list[int], int]] = {}

    # ---------------------------------------------------------------------------------- pieces
    def between_turns(self, tokenizer: Any, success: bool) -> tuple[list[int], int]:
        """``(template ids, end-of-turn id)`` for the turn after an answer (feedback or success feedback),
        computed once per tokenizer (:func:`template_suffix_ids`)."""
        text = self.success_feedback if success else self.feedback
        key = (id(tokenizer), text)
        if key not in self._suffixes:
            _, end_id = turn_end_token_of(tokenizer, self.turn_end_token)
            ids = template_suffix_ids(tokenizer, [{"role": "user", "content": text}],
                                      turn_end_token=self.turn_end_token)
            self._suffixes[key] = (ids, end_id)
        return self._suffixes[key]

    def rewards(self, conv: Conversation) -> list[float]:
        """The training reward of each turn of a scored conversation (``reward_mode``; module docstring)."""
        if self.reward_mode == "final":
            return [final_reward(conv.turn_rewards, self.turn_discount)] * len(conv.turns)
        return per_turn_returns(conv.turn_rewards, self.turn_discount, self.turn_reward_bias,
                                self.turn_reward_scaling)

    async def run_conversation(self, client: Any, item: Item) -> Conversation:
        """One conversation on ``item``, every turn scored (:attr:`TurnRecord.reward`).

        Raises:
            RewardFailed: a reward call failed (error or timeout; the episode is then dropped, counted).
            TokenDriftError: the engine answered something else than the conversation's ids.
        """
        conv = Conversation.start(item.prompt_ids)
        budget = self.max_new_tokens or client.sampling.max_new_tokens
        for t in range(self.max_turns):
            room = budget if self.max_total_tokens is None else min(budget, self.max_total_tokens - len(conv.ids))
            (comp,) = await client.generate(conv.ids, n=1, max_new_tokens=max(1, room))
            prompt_ids = conv.ids[:]  # what the engine answered (checked by add_generation)
            rec = conv.add_generation(comp)
            prompt = item.prompt if t == 0 else client.decode(prompt_ids, skip_special_tokens=False)
            rec.reward = await client.reward(prompt, client.decode(comp.output_ids), prompt_ids,
                                             list(comp.output_ids), **item.fields)
            if t == self.max_turns - 1 or (rec.success and self.stop_on_success):
                break
            ids, end_id = self.between_turns(client.tokenizer, rec.success)
            gen = conv.ids[rec.start:rec.end]
            between = ([] if gen and gen[-1] == end_id else [end_id]) + ids
            if self.max_total_tokens is not None and len(conv.ids) + len(between) >= self.max_total_tokens:
                break  # no room left for another turn: the conversation ends here
            conv.add_template(between)
        return conv

    async def run_conversations(self, client: Any, item: Item, n: int) -> list[Conversation]:
        """``n`` concurrent conversations on ``item``; a failed reward is raised after all of them finished (so
        every outcome is counted)."""
        return await gather_runs([self.run_conversation(client, item) for _ in range(n)])

    async def arun_episode(self, client: Any, item: Item) -> Group:
        """The episode's :class:`Group`: per conversation, one trajectory per turn (training), or one per
        conversation when ``client.evaluating`` and ``eval_export`` is ``"episode"``."""
        n = self.n_samples or client.group_size
        convs = await self.run_conversations(client, item, n)
        gid = client.episode_id
        samples: list[Trajectory] = []
        outcomes: list[ConversationOutcome] = []
        for conv in convs:
            first = len(samples)
            if getattr(client, "evaluating", False) and self.eval_export == "episode":
                samples.append(conv.trajectory(len(conv.turns) - 1, success_reward(conv, self.turn_discount), gid))
            elif self.layout == "concat":
                samples.append(conv.concat_trajectory(self.rewards(conv)[-1], gid))
            else:
                samples.extend(conv.trajectory(t, r, gid) for t, r in enumerate(self.rewards(conv)))
            outcomes.append(conv.outcome(range(first, len(samples))))
        return Group(gid, item, samples, conversations=outcomes)


class Boba2MathMultiTurnAgent(MultiTurnWorkflow):
    """boba²'s ``MathMultiTurnAgent`` defaults (IA@v0.3.0 ``realhf/impl/agent/math_multi_turn_agent.py``,
    registered ``"math-multi-turn"``): ``num_turns=5``, every turn run (no early stop), per-turn rewards
    ``((s - 0.5) * 2 - reward_bias) * reward_scaling`` (its defaults 0 and 1: +-1) with discounted returns at
    ``turn_level_discount=1.0``; feedback "Unfortunately your answer is wrong. Let's try again." or
    "Congratulations! You are correct!". Differences: the feedback ids come from the template's own turn
    (:func:`template_suffix_ids`) instead of ``tokenizer("\\n" + render)``; turns are trained as separate
    samples of a group, as boba² did (one sequence per turn), with the group size of the run (boba² forced
    ``n=1``). Arguments as :class:`MultiTurnWorkflow` (these defaults only).
    """

    def __init__(self, max_turns: int = 5, turn_discount: float = 1.0,
                 feedback: str = "Unfortunately your answer is wrong. Let's try again.",
                 reward_mode: str = "per_turn", stop_on_success: bool = False,
                 success_feedback: str = "Congratulations! You are correct!",
                 turn_reward_bias: float = -0.5, turn_reward_scaling: float = 2.0, **kwargs: Any) -> None:
        super().__init__(max_turns=max_turns, turn_discount=turn_discount, feedback=feedback,
                         reward_mode=reward_mode, stop_on_success=stop_on_success,
                         success_feedback=success_feedback, turn_reward_bias=turn_reward_bias,
                         turn_reward_scaling=turn_reward_scaling, **kwargs)


# --------------------------------------------------------------------------------------------------
# Accuracy per turn
# --------------------------------------------------------------------------------------------------
async def turn_accuracy(workflow: MultiTurnWorkflow, client: Any, items: Sequence[Item]) -> dict[str, float]:
    """First-try and within-``max_turns`` accuracy of one conversation per item.

    Args:
        workflow: the multi-turn workflow (its ``max_turns``, feedback, budgets).
        client: an :class:`~areal_cli.rollout.episode.EpisodeClient` (its sampling: greedy for a greedy
            accuracy); each item gets ``client.for_episode(i)``.
        items: the held-out items.
    Returns:
        ``{"first_try": fraction right at turn 1, "within_max_turns": fraction right at some turn,
        "mean_turns": turns taken on average, "n": items scored, "reward_failures": items whose reward failed
        (counted as wrong)}``; a conversation whose reward failed counts as wrong.
    """
    async def one(i: int, item: Item) -> Conversation | None:
        try:
            return await workflow.run_conversation(client.for_episode(i, item), item)
        except RewardFailed:
            return None

    convs = await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
    return conversation_metrics([c.outcome() if c is not None else None for c in convs])


def conversation_metrics(outcomes: Sequence[ConversationOutcome | None]) -> dict[str, float]:
    """First-try accuracy, accuracy within ``max_turns`` and mean turns of conversations: the one definition
    shared by :func:`turn_accuracy` (``python -m areal_cli.workflows.multi_turn_eval``) and the training loop's
    per-step and held-out multi-turn metrics (:attr:`~areal_cli.api.types.Group.conversations`).

    Args:
        outcomes: one per conversation; None for a conversation whose reward failed (counted as wrong, and not
            in the mean number of turns).
    Returns:
        ``{"first_try": fraction right at turn 1, "within_max_turns": fraction right at some turn,
        "mean_turns": turns taken on average, "n": conversations, "reward_failures": conversations whose reward
        failed}``; fractions are of all conversations (0.0 for none).
    """
    n = max(len(outcomes), 1)
    ok = [c for c in outcomes if c is not None]
    return {"first_try": sum(c.first_success == 0 for c in ok) / n,
            "within_max_turns": sum(c.first_success is not None for c in ok) / n,
            "mean_turns": sum(c.turns for c in ok) / max(len(ok), 1), "n": float(len(outcomes)),
            "reward_failures": float(len(outcomes) - len(ok))}


def turn_metrics(groups: Sequence[Any], prefix: str) -> dict:
    """First-try accuracy, accuracy within ``max_turns`` and mean turns per conversation of the multi-turn
    ``groups`` (those reporting :attr:`~areal_cli.api.types.Group.conversations`), as metrics-line keys
    ``{prefix}first_try``, ``{prefix}within_max_turns``, ``{prefix}mean_turns``
    (:func:`conversation_metrics`, the definitions of
    ``python -m areal_cli.workflows.multi_turn_eval``); ``{}`` when no group reports conversations."""
    outcomes = [o for g in groups for o in (g.conversations or [])]
    if not outcomes:
        return {}
    return turn_keys(conversation_metrics(outcomes), prefix)


def turn_keys(m: dict | None, prefix: str) -> dict:
    """The three multi-turn metrics of a :func:`conversation_metrics` dict as metrics-line keys (6 decimals)."""
    if not m:
        return {}
    return {f"{prefix}{k}": round(float(m[k]), 6) for k in ("first_try", "within_max_turns", "mean_turns")}
