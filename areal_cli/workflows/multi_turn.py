"""Multi-turn RL: a token-exact conversation and AReaL's multi-turn workflow (answer, be scored, get feedback,
try again).

One episode (:meth:`MultiTurnWorkflow.arun_episode`) = ``group_size`` independent conversations on one prompt.
Each conversation (:class:`Conversation`) runs up to ``max_turns`` turns:

1. the model answers ``Conversation.ids`` (the whole conversation so far, sent as token ids);
2. the task's reward function scores the answer (the reward pool, as in the single-turn workflow);
3. a correct answer (reward > 0) ends the conversation; after a wrong one the feedback turn is appended --
   the end-of-turn token when the model did not produce it, then the chat template's ids of a user message
   holding ``feedback`` and of the next generation prompt (:func:`template_suffix_ids`) -- and the model
   tries again.

Token-exactness (the classic failures of multi-turn RL; DESIGN.md §4): a turn's prompt is the previous turn's
ids verbatim plus only the new template ids -- earlier turns are never decoded, re-rendered through the chat
template or re-tokenised (:meth:`Conversation.add_generation` checks the engine was given exactly those ids).
The new ids come from ONE render of a stub conversation, cut right after the stub answer's end-of-turn token,
so a template that rewrites earlier turns (Qwen3 drops earlier ``<think>`` blocks) or adds a system prompt
cannot leak into the sequence; the cut is checked to tokenise exactly as in the full render. Generated tokens
keep their behaviour logprobs and the policy version of the weights that produced each of them (a turn
interrupted by a weight update is resumed by the rollout client with its prefix: the versions then change
inside the turn); template and feedback tokens carry loss mask 0, logprob 0 and version -1.

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
sequence-level off-policy corrections (``behav_imp_weight_mode: sequence_*`` see a turn as the sequence); it
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
from dataclasses import dataclass, field
from typing import Any

from areal_cli.api.types import Group, Item, RewardFailed, Trajectory, gather_runs
from areal_cli.errors import UserError

#: Default feedback after a wrong answer (a workflow argument, ``feedback``).
FEEDBACK = "Wrong. Try again."
#: Default feedback after a right answer when conversations go on (``stop_on_success: false``).
SUCCESS_FEEDBACK = "Correct."
REWARD_MODES = ("final", "per_turn")
EVAL_EXPORTS = ("episode", "turns")
#: Training layouts: one sample per turn (boba²) or one concatenated sample per conversation (AReaL).
LAYOUTS = ("per_turn", "concat")

# Stub contents of the conversation whose render gives the template ids of a new turn (never sent to a model).
_STUB_USER = "AREAL_STUB_QUESTION"
_STUB_ANSWER = "AREAL_STUB_ANSWER"


# --------------------------------------------------------------------------------------------------
# Chat-template ids of a new turn
# --------------------------------------------------------------------------------------------------
def _ids(tokenizer: Any, text: str) -> list[int]:
    """``text`` -> ids without added special tokens (how :mod:`areal_cli.tasks.prompts` tokenises a rendered
    chat template)."""
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def turn_end_token_of(tokenizer: Any, turn_end_token: str | None = None) -> tuple[str, int]:
    """``(text, id)`` of the token that ends an assistant turn in the chat template: ``turn_end_token``, or the
    tokenizer's eos token (``<|im_end|>`` for ChatML / Qwen, ``<｜end▁of▁sentence｜>`` for DeepSeek-R1).

    Raises:
        UserError: no such token in the tokenizer (name ``workflow_args.turn_end_token``).
    """
    tok = turn_end_token or getattr(tokenizer, "eos_token", None)
    if not tok:
        raise UserError("field 'workflow_args.turn_end_token': the tokenizer has no eos token; name the token that "
                        "ends an assistant turn in its chat template")
    tid = tokenizer.convert_tokens_to_ids(tok)
    if not isinstance(tid, int) or tid < 0 or (getattr(tokenizer, "unk_token_id", None) is not None
                                                and tid == tokenizer.unk_token_id):
        raise UserError(f"field 'workflow_args.turn_end_token': {tok!r} is not a token of the model's tokenizer")
    return tok, int(tid)


def template_suffix_ids(tokenizer: Any, new_messages: Sequence[dict], *, turn_end_token: str | None = None,
                        add_generation_prompt: bool = True) -> list[int]:
    """The token ids the chat template puts after an assistant turn's end-of-turn token when ``new_messages``
    (a user feedback message, a tool result, ...) follow it, up to and including the next generation prompt.

    Rule (AReaL ``areal/workflow/multi_turn.py`` precomputes the same ids by diffing two renders; its concat
    export cuts a full render at the parent's k-th EOS, ``areal/experimental/openai/``): render ONE stub
    conversation ``[user stub, assistant stub] + new_messages`` with the tokenizer's own template (as text,
    ``add_generation_prompt``), cut it right after the first end-of-turn token that follows the stub answer,
    and tokenise the tail. Everything a template puts between turns (ChatML's ``"\\n"`` after ``<|im_end|>``,
    the next role header, R1's ``<｜User｜>`` marker, a generation prompt opening ``<think>``) is in it; the
    stub's own rendering (a default system prompt, Qwen3 rewriting earlier ``<think>`` blocks) is not.
    (AReaL's diff of ``[assistant stub]`` against ``[assistant stub, feedback]`` drops ChatML's ``"\\n"`` after
    ``<|im_end|>``: its sequence is not what the template renders; boba² tokenised ``"\\n" + render`` with a plain
    tokenizer call, which may put a BOS mid-sequence.)

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        new_messages: ``[{"role": ..., "content": str}, ...]`` appended after the assistant turn.
        turn_end_token: the token ending an assistant turn (default: the eos token, :func:`turn_end_token_of`).
        add_generation_prompt: end with the template's generation prompt (the next assistant turn's header).
    Returns:
        list[int], length >= 1: the new ids (not including the end-of-turn token itself).
    Raises:
        UserError: no chat template, the template fails, no end-of-turn token after the stub answer, or the
            cut does not tokenise as the full render (the template is not splittable at a turn end).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("field 'workflow': the multi-turn workflow needs a tokenizer with a chat template")
    end_text, _ = turn_end_token_of(tokenizer, turn_end_token)
    msgs = [{"role": "user", "content": _STUB_USER}, {"role": "assistant", "content": _STUB_ANSWER},
            *[dict(m) for m in new_messages]]
    try:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - jinja errors of the model's template
        raise UserError(f"field 'workflow': the chat template failed on a multi-turn conversation: "
                        f"{type(e).__name__}: {e}") from None
    at = text.find(_STUB_ANSWER)
    end = text.find(end_text, at + len(_STUB_ANSWER)) if at >= 0 else -1
    if end < 0:
        raise UserError(f"field 'workflow_args.turn_end_token': the chat template does not end an assistant turn "
                        f"with {end_text!r}; name the token that does")
    cut = end + len(end_text)
    head, tail = text[:cut], text[cut:]
    new = _ids(tokenizer, tail)
    if not new or _ids(tokenizer, text) != _ids(tokenizer, head) + new:
        raise UserError(f"field 'workflow': the chat template's turn after {end_text!r} does not tokenise on its own "
                        f"as in the full conversation; multi-turn token ids cannot be built without re-tokenising")
    return new


# --------------------------------------------------------------------------------------------------
# The conversation
# --------------------------------------------------------------------------------------------------
@dataclass
class TurnRecord:
    """One assistant turn of a :class:`Conversation`.

    Attributes:
        start, end: the generated tokens are ``Conversation.ids[start:end]`` (``start`` = the turn's prompt length).
        finish_reason: ``"stop"`` or ``"length"``.
        n_interruptions: times a weight update interrupted the turn (each resumed with its prefix).
        reward: the reward function's value for this turn's answer (None until scored).
    """

    start: int
    end: int
    finish_reason: str
    n_interruptions: int = 0
    reward: float | None = None

    @property
    def success(self) -> bool:
        """The answer was right: reward > 0 (the success rule of ``success_rate_lb/ub`` and of AReaL's
        ``reward != 0`` stop for 0/1 rewards)."""
        return self.reward is not None and self.reward > 0


class TokenDriftError(RuntimeError):
    """The engine was asked to continue something other than the conversation's exact ids (a bug: earlier
    turns must reach the engine verbatim)."""


@dataclass
class Conversation:
    """A linear chat as token ids, with per-token training data (AReaL's concatenated trajectory dict).

    All lists have the length ``N = len(ids)``:

    Attributes:
        ids: list[int]: the prompt, then each turn's generated ids and the template/feedback ids between turns.
        loss_mask: list[int]: 1 on generated tokens, 0 on prompt, template and feedback tokens.
        logprobs: list[float] (nats): the behaviour logprob of each generated token, 0.0 elsewhere.
        versions: list[int]: the policy version that produced each generated token, -1 elsewhere.
        turn_ids: list[int]: ``t`` on the tokens generated in turn ``t`` (0-based), -1 elsewhere
            (AReaL >= v2.0 ``turn_ids``).
        turns: one :class:`TurnRecord` per assistant turn.
        n_prompt: P, the length of the first prompt.
    """

    ids: list[int]
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    n_prompt: int = 0

    @classmethod
    def start(cls, prompt_ids: Sequence[int]) -> Conversation:
        """A conversation holding only the prompt (P >= 1 ids; loss mask 0, logprob 0, version -1).

        Raises:
            ValueError: an empty prompt.
        """
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise ValueError("a conversation needs a non-empty prompt")
        n = len(ids)
        return cls(ids, [0] * n, [0.0] * n, [-1] * n, [-1] * n, [], n)

    def add_template(self, ids: Sequence[int]) -> None:
        """Append environment / chat-template ids (loss mask 0, logprob 0, version -1, turn -1)."""
        n = len(ids)
        self.ids.extend(int(i) for i in ids)
        self.loss_mask.extend([0] * n)
        self.logprobs.extend([0.0] * n)
        self.versions.extend([-1] * n)
        self.turn_ids.extend([-1] * n)

    def add_generation(self, completion: Any) -> TurnRecord:
        """Append one turn's completion (a :class:`~areal_cli.rollout.client.Completion`): its output ids,
        behaviour logprobs and per-token versions, verbatim.

        Raises:
            TokenDriftError: ``completion.prompt_ids`` is not exactly ``self.ids`` (the engine generated from
                something else than this conversation).
            ValueError: output ids, logprobs and versions differ in length.
        """
        if list(completion.prompt_ids) != self.ids:
            raise TokenDriftError(f"turn {len(self.turns)}: the engine was given {len(completion.prompt_ids)} ids that "
                                  f"are not this conversation's {len(self.ids)} ids")
        out, lps, vers = list(completion.output_ids), list(completion.output_logprobs), list(completion.output_versions)
        if not len(out) == len(lps) == len(vers):
            raise ValueError(f"completion has {len(out)} ids, {len(lps)} logprobs, {len(vers)} versions")
        t = len(self.turns)
        start = len(self.ids)
        self.ids.extend(int(i) for i in out)
        self.loss_mask.extend([1] * len(out))
        self.logprobs.extend(float(x) for x in lps)
        self.versions.extend(int(v) for v in vers)
        self.turn_ids.extend([t] * len(out))
        rec = TurnRecord(start, len(self.ids), completion.finish_reason, int(completion.n_interruptions))
        self.turns.append(rec)
        return rec

    def turn_prompt(self, t: int) -> list[int]:
        """The ids the model answered in turn ``t``: everything before its first generated token."""
        return self.ids[: self.turns[t].start]

    def trajectory(self, t: int, reward: float, group_id: int = 0) -> Trajectory:
        """Turn ``t`` as a trainer sample: prompt = :meth:`turn_prompt`, output = its generated tokens."""
        rec = self.turns[t]
        return Trajectory(prompt_ids=self.turn_prompt(t), output_ids=self.ids[rec.start:rec.end],
                          behaviour_logprobs=self.logprobs[rec.start:rec.end],
                          versions=self.versions[rec.start:rec.end], reward=float(reward), group_id=group_id,
                          finish_reason=rec.finish_reason, n_interruptions=rec.n_interruptions)

    def concat_trajectory(self, reward: float, group_id: int = 0, upto: int | None = None) -> Trajectory:
        """The whole conversation as ONE trainer sample (AReaL's concatenated layout): prompt = the first
        prompt (``ids[:turns[0].start]``), output = everything from the first generated token to the end of turn
        ``upto`` (default the last), with :attr:`Trajectory.loss_mask` 1 on generated tokens and 0 on the
        feedback / tool / template tokens between turns (logprob 0, version -1 there); ids after the last turn
        are left out. ``finish_reason`` and ``n_interruptions`` are the last turn's and the sum over turns.

        Raises:
            ValueError: no turn.
        """
        if not self.turns:
            raise ValueError("a conversation without a turn has nothing to train on")
        last = self.turns[-1 if upto is None else upto]
        turns = self.turns[: (len(self.turns) if upto is None else upto + 1)]
        a, b = self.turns[0].start, last.end
        return Trajectory(prompt_ids=self.ids[:a], output_ids=self.ids[a:b], behaviour_logprobs=self.logprobs[a:b],
                          versions=self.versions[a:b], reward=float(reward), group_id=group_id,
                          finish_reason=last.finish_reason, n_interruptions=sum(t.n_interruptions for t in turns),
                          loss_mask=self.loss_mask[a:b])

    def export(self) -> dict[str, list]:
        """AReaL's concatenated form (``export_interactions(style="concat")`` / ``MultiTurnWorkflow``): the
        whole conversation with ``input_ids``, ``loss_mask``, ``logprobs``, ``versions``, ``turn_ids`` (length
        N each) and ``rewards`` (one per turn, None where unscored)."""
        return {"input_ids": list(self.ids), "loss_mask": list(self.loss_mask), "logprobs": list(self.logprobs),
                "versions": list(self.versions), "turn_ids": list(self.turn_ids),
                "rewards": [r.reward for r in self.turns]}

    @property
    def turn_rewards(self) -> list[float]:
        """The reward of each scored turn, in order."""
        return [float(r.reward) for r in self.turns if r.reward is not None]

    @property
    def first_success(self) -> int | None:
        """Index of the first turn with reward > 0, or None."""
        return next((t for t, r in enumerate(self.turns) if r.success), None)


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
    return UserError(f"field 'workflow_args.{name}': {why} (got {value!r})")


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
    """``async arun_episode(client, item) -> Group``: ``group_size`` conversations of up to ``max_turns`` turns
    (module docstring: data flow, token-exactness, reward rules, layout).

    Args:
        max_turns: answers per conversation, >= 1 (AReaL ``max_turns``; 1 = the single-turn workflow).
        turn_discount: in (0, 1] (AReaL ``turn_discount``; its multi_turn_math example hard-codes 0.9).
        feedback: the user message after a wrong answer (rendered by the model's chat template).
        reward_mode: ``"final"`` (AReaL) or ``"per_turn"`` (boba²'s per-turn discounted returns).
        stop_on_success: end a conversation at its first right answer (AReaL; ``final`` requires it). boba²
            ran all turns: ``false``, with ``success_feedback`` after a right answer.
        success_feedback: the user message after a right answer when conversations go on.
        turn_reward_bias, turn_reward_scaling: ``per_turn`` shaping of each turn's reward before discounting.
        n_samples: conversations per prompt (default: the run's ``group_size``).
        max_new_tokens: generation budget of EACH turn (default: the run's ``max_new_tokens``).
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
        UserError: one line naming the bad argument (``field 'workflow_args.max_turns': ...``).
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
        for conv in convs:
            if getattr(client, "evaluating", False) and self.eval_export == "episode":
                samples.append(conv.trajectory(len(conv.turns) - 1, success_reward(conv, self.turn_discount), gid))
            elif self.layout == "concat":
                samples.append(conv.concat_trajectory(self.rewards(conv)[-1], gid))
            else:
                samples.extend(conv.trajectory(t, r, gid) for t, r in enumerate(self.rewards(conv)))
        return Group(gid, item, samples)


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
            return await workflow.run_conversation(client.for_episode(i), item)
        except RewardFailed:
            return None

    convs = await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))
    n = max(len(items), 1)
    ok = [c for c in convs if c is not None]
    return {"first_try": sum(c.turns[0].success for c in ok) / n,
            "within_max_turns": sum(c.first_success is not None for c in ok) / n,
            "mean_turns": sum(len(c.turns) for c in ok) / max(len(ok), 1), "n": float(len(items)),
            "reward_failures": float(len(convs) - len(ok))}
