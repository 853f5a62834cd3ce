"""A token-exact multi-turn conversation: a chat kept as token ids with per-token training data, and the chat
template ids of each new turn.

Token-exactness (the classic failures of multi-turn RL; DESIGN.md §4): a turn's prompt is the previous turn's
ids verbatim plus only the new template ids -- earlier turns are never decoded, re-rendered through the chat
template or re-tokenised (:meth:`Conversation.add_generation` checks the engine was given exactly those ids).
The new ids come from ONE render of a stub conversation, cut right after the stub answer's end-of-turn token,
so a template that rewrites earlier turns (Qwen3 drops earlier ``<think>`` blocks) or adds a system prompt
cannot leak into the sequence; the cut is checked to tokenise exactly as in the full render. Generated tokens
keep their behaviour logprobs and the policy version of the weights that produced each of them (a turn
interrupted by a weight update is resumed by the rollout client with its prefix: the versions then change
inside the turn); template and feedback tokens carry loss mask 0, logprob 0 and version -1.

Used by the multi-turn workflow (:mod:`areal_cli.workflows.multi_turn`) and the agent proxy
(:mod:`areal_cli.agents.proxy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_cli.api.types import ConversationOutcome, Trajectory
from areal_cli.foundations.errors import UserError

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
        raise UserError("field 'task.workflow_args.turn_end_token': the tokenizer has no eos token; name the token that "
                        "ends an assistant turn in its chat template")
    tid = tokenizer.convert_tokens_to_ids(tok)
    if not isinstance(tid, int) or tid < 0 or (getattr(tokenizer, "unk_token_id", None) is not None
                                                and tid == tokenizer.unk_token_id):
        raise UserError(f"field 'task.workflow_args.turn_end_token': {tok!r} is not a token of the model's tokenizer")
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
        raise UserError("field 'task.workflow': the multi-turn workflow needs a tokenizer with a chat template")
    end_text, _ = turn_end_token_of(tokenizer, turn_end_token)
    msgs = [{"role": "user", "content": _STUB_USER}, {"role": "assistant", "content": _STUB_ANSWER},
            *[dict(m) for m in new_messages]]
    try:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - jinja errors of the model's template
        raise UserError(f"field 'task.workflow': the chat template failed on a multi-turn conversation: "
                        f"{type(e).__name__}: {e}") from None
    at = text.find(_STUB_ANSWER)
    end = text.find(end_text, at + len(_STUB_ANSWER)) if at >= 0 else -1
    if end < 0:
        raise UserError(f"field 'task.workflow_args.turn_end_token': the chat template does not end an assistant turn "
                        f"with {end_text!r}; name the token that does")
    cut = end + len(end_text)
    head, tail = text[:cut], text[cut:]
    new = _ids(tokenizer, tail)
    if not new or _ids(tokenizer, text) != _ids(tokenizer, head) + new:
        raise UserError(f"field 'task.workflow': the chat template's turn after {end_text!r} does not tokenise on its own "
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

    def outcome(self, samples: Sequence[int] = ()) -> ConversationOutcome:
        """How the conversation went (turns taken, first success) for :attr:`Group.conversations`; ``samples``: the
        indices of its trajectories in the group."""
        return ConversationOutcome(len(self.turns), self.first_success, tuple(int(i) for i in samples))
