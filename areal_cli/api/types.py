"""The data contracts of a rollout episode: what a workflow receives (:class:`Item`) and returns
(:class:`Group` of :class:`Trajectory`), and the two errors it may raise.

Pure dataclasses (no torch, no I/O): the controller, the trainer, checkpoints and user workflows share them.
Field names follow AReaL's trajectory dict (``areal/workflow/rlvr.py``): prompt/output token ids, behaviour
logprobs (the inference engine's, verbatim), per-token policy versions (-1 for prompt tokens) and a
scalar reward per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable

from areal_cli.foundations.errors import UserError


@dataclass(frozen=True)
class Item:
    """One example of the training (or held-out) data, prompt rendered, as a workflow receives it.

    Attributes:
        id: stable identifier (the record's id field, else its ``file:line``).
        prompt_ids: the prompt's token ids (chat template or protocol applied; list[int], length P >= 1).
        prompt: the prompt as text (what the token ids encode; what a reward function receives).
        fields: every field of the dataset record, passed to the reward function as keyword arguments.
        where: where the record came from (``file:line``; ``""`` for generated data), for error messages.
    """

    id: str
    prompt_ids: list[int]
    prompt: str
    fields: dict = field(default_factory=dict)
    where: str = ""


@dataclass
class Trajectory:
    """One sample: the trainer's data contract (DESIGN §3).

    Attributes:
        prompt_ids: list[int], length P >= 1 (not trained on).
        output_ids: list[int], length R: the generated tokens, exactly as the engine produced them.
        behaviour_logprobs: list[float], length R: the engine's logprob (nats) of each output token.
        versions: list[int], length R: the policy version that produced each output token.
        reward: the sample's reward as returned by the reward function (shaping is the trainer's:
            ``ppo.reward_bias`` / ``ppo.reward_scaling``).
        group_id: the episode (group) it belongs to.
        finish_reason: ``"stop"`` (an end token) or ``"length"`` (budget exhausted).
        n_interruptions: times a weight update interrupted it (each resumed with its prefix).
        loss_mask: optional list[int] of 0/1, length R (the *concatenated* layout of a multi-turn or agent
            trajectory, AReaL's ``export_interactions(style="concat")``): 0 on environment, tool and chat-template
            tokens inside the response, which must then carry behaviour logprob 0.0 and version -1 (DESIGN §4);
            None = every output token is trained (the single-turn layout).
    """

    prompt_ids: list[int]
    output_ids: list[int]
    behaviour_logprobs: list[float]
    versions: list[int]
    reward: float
    group_id: int
    finish_reason: str
    n_interruptions: int = 0
    loss_mask: list[int] | None = None

    @property
    def head_version(self) -> int:
        """The oldest policy version that generated a token (-1 when nothing was generated). Tokens with
        version -1 (environment / template tokens of the concatenated layout) are not generated and are skipped."""
        return min((v for v in self.versions if v >= 0), default=-1)

    def check(self) -> str | None:
        """Why this trajectory cannot be trained on (one phrase), or None when it is well formed."""
        n = len(self.output_ids)
        if not self.prompt_ids:
            return "empty prompt_ids"
        if len(self.behaviour_logprobs) != n or len(self.versions) != n:
            return (f"{n} output_ids but {len(self.behaviour_logprobs)} behaviour_logprobs and "
                    f"{len(self.versions)} versions")
        if self.loss_mask is not None:
            why = loss_mask_problem(self.loss_mask, self.behaviour_logprobs, self.versions)
            if why:
                return why
        if not isinstance(self.reward, (int, float)) or isinstance(self.reward, bool) or self.reward != self.reward \
                or self.reward in (float("inf"), float("-inf")):
            return f"reward {self.reward!r} is not a finite number"
        return None


def loss_mask_problem(loss_mask: Any, logprobs: Any, versions: Any) -> str | None:
    """Why a per-output-token ``loss_mask`` is unusable with these behaviour ``logprobs`` and ``versions`` (one
    phrase), or None. Rules (DESIGN §4; AReaL's concatenated trajectory dict): one entry per output token, each 0
    or 1; a masked token (0) is not generated, so its logprob is 0.0 and its version -1."""
    try:
        n_mask = len(loss_mask)
    except TypeError:
        return f"loss_mask is a {type(loss_mask).__name__}, not a list of 0/1"
    if n_mask != len(logprobs):
        return f"loss_mask has {n_mask} entries for {len(logprobs)} output tokens (one per output token)"
    for i, (m, lp, v) in enumerate(zip(loss_mask, logprobs, versions)):
        if isinstance(m, bool) or m not in (0, 1):
            return f"loss_mask[{i}] = {m!r} is not 0 or 1"
        if m == 0 and (int(v) != -1 or float(lp) != 0.0):
            return (f"output token {i} is masked (loss_mask 0: an environment/template token) but has version "
                    f"{v} and logprob {lp} (a masked token must have version -1 and logprob 0.0)")
    return None


@dataclass(frozen=True)
class ConversationOutcome:
    """How one conversation of a multi-turn episode went, as its workflow reports it
    (:attr:`Group.conversations`): what first-try accuracy, accuracy within ``max_turns`` and turns per episode
    are computed from (:func:`areal_cli.workflows.multi_turn.conversation_metrics`).

    Attributes:
        turns: assistant turns taken (>= 1).
        first_success: index (0-based) of the first turn whose answer was right (reward > 0), or None.
        samples: indices into :attr:`Group.samples` of the conversation's trajectories, in turn order (its last
            one holds the whole conversation before the last answer as its prompt).
    """

    turns: int
    first_success: int | None
    samples: tuple[int, ...] = ()


@dataclass
class Group:
    """The samples of one episode (``rollout.group_size`` answers to one prompt, in the single-turn workflow).

    ``success_rate`` (the fraction of samples with reward > 0) is what ``success_rate_lb/ub`` filter on.
    ``conversations`` (optional, a multi-turn workflow sets it): one :class:`ConversationOutcome` per conversation
    of the episode; the training loop's multi-turn metrics and its logged samples read it.
    """

    group_id: int
    item: Item
    samples: list[Trajectory]
    conversations: list[ConversationOutcome] | None = None

    @property
    def success_rate(self) -> float:
        return sum(s.reward > 0 for s in self.samples) / len(self.samples)


class RewardFailed(Exception):
    """A reward call ended in ``error`` or ``timeout`` (counted by the client). Raised out of a workflow,
    it drops the episode as ``groups_dropped_reward_failure``: never a silent reward of 0."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"reward {status}: {message}")
        self.status, self.message = status, message


class WorkflowError(UserError):
    """A workflow broke its contract (returned something that is not a well-formed :class:`Group`) or raised.
    Ends the run with one line naming the workflow (exit 2): a bug to fix, not a data problem to count."""


def describe(obj: Any) -> str:
    """Short type description for error messages."""
    return type(obj).__name__


async def gather_runs(runs: list[Awaitable[Any]]) -> list[Any]:
    """Await ``runs`` concurrently and return their results in order; when any failed, raise after all finished
    (so every outcome is counted): a :class:`RewardFailed` first (the episode is dropped as a reward failure),
    else the first other exception."""
    import asyncio

    results = await asyncio.gather(*runs, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    for r in failed:
        if isinstance(r, RewardFailed):
            raise r
    if failed:
        raise failed[0]
    return list(results)
