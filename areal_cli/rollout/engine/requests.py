"""What goes into the embedded engine and what comes back: :class:`Request` (one request while the engine holds it),
:class:`EngineResult` (a finished or aborted one) and :class:`EngineError` (a request it cannot serve).
:mod:`~areal_cli.rollout.engine.scheduler` creates and steps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from areal_cli.rollout.protocol import SamplingParams

__all__ = ["EngineError", "EngineResult", "Request"]


class EngineError(ValueError):
    """A request the engine cannot serve (bad ids, too long, can never fit in the KV cache, duplicate id).

    The message is one line; the server returns it as a 400 ``{"error": {"message": ...}}``.
    """


@dataclass
class EngineResult:
    """A finished (or aborted) request.

    Attributes:
        rid: request id.
        prompt_ids: the prompt as submitted.
        output_ids: generated ids; a matched stop/EOS token is the last one.
        output_logprobs: per output token, natural log (:mod:`~areal_cli.rollout.engine.sampling` defines it).
        output_versions: weight-version label of each output token (the weights that produced it).
        finish_reason: "stop" | "length" | "abort".
        matched_stop: the matched stop/EOS id for "stop", else None.
        max_new_tokens: the request's budget (SGLang reports it as ``finish_reason.length``).
        weight_version: engine weight version when the request finished.
        input_logprobs: ``(logprob | None, id)`` per prompt position from ``logprob_start_len``
            (position 0 has None), or None when not requested. Computed with T = 1 (raw logits).
        num_retractions: times the request was retracted (KV dropped and recomputed).
        e2e_latency: seconds from submission to finish.
        abort_message: reason for "abort" ("Aborted" by default), else None.
    """

    rid: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[str]
    finish_reason: str
    matched_stop: int | None
    max_new_tokens: int
    weight_version: str
    input_logprobs: list[tuple[float | None, int]] | None = None
    num_retractions: int = 0
    e2e_latency: float = 0.0
    abort_message: str | None = None


@dataclass(eq=False)  # identity semantics: requests are compared/removed by object, never field-wise
class Request:
    """One request inside the engine: what was asked, what it generated so far and where its KV lives."""

    rid: str
    prompt: list[int]
    params: SamplingParams
    logprob_start_len: int
    seed: int
    t_arrival: float
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[str] = field(default_factory=list)
    input_logprobs: list[tuple[float | None, int]] | None = None
    slots: torch.Tensor | None = None  # LongTensor [reserved] KV pool slots, position j -> slots[j]
    slot_list: list[int] | None = None
    row: int = -1  # its row of the engine's slot table while it holds slots
    kv_len: int = 0  # positions whose K/V is in the pool
    num_retractions: int = 0
    stop_ids: frozenset[int] = frozenset()

    @property
    def need(self) -> int:
        """KV slots it reserves at admission: ``len(prompt) + max_new_tokens``."""
        return len(self.prompt) + self.params.max_new_tokens
