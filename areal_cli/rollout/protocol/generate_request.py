"""``POST /generate`` requests: sampling parameters, one prompt or a batch, their builders, the server's parser.

Body (recorded from SGLang 0.5.23, ``shared/fixtures/sglang`` of the workspace): ``{input_ids: [int] | [[int]],
sampling_params: {...}, return_logprob, rid?}``; a list of lists is a batch, answered by a list in input order.
Token ids only, never text: they are used verbatim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from areal_cli.rollout.protocol.errors import ProtocolError
from areal_cli.rollout.protocol.fields import is_int, is_number

# Keys of SGLang's ``sampling_params`` schema (0.5.23; from the recorded "unknown field" error, which lists
# the allowed keys, plus ``sampling_seed``). Anything else is rejected by SGLang with HTTP 400.
SGLANG_SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params",
})


@dataclass
class SamplingParams:
    """Sampling parameters of one generation request (SGLang ``sampling_params``).

    Attributes:
        max_new_tokens: maximum number of generated tokens (>= 0).
        temperature: softmax temperature; 0 means greedy argmax (>= 0, finite).
        top_p: nucleus mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; -1 disables it (else >= 1).
        stop_token_ids: extra token ids that end generation (the matched id is the last output token).
        ignore_eos: when True the model's EOS token does not end generation.
        min_new_tokens: (added) EOS and stop tokens are masked out (logit -inf) until this many tokens
            were generated (SGLang's ``min_new_tokens``). Sent only when > 0.
        seed: (added) per-request sampling seed, SGLang's ``sampling_seed``. Sent only when not None.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_new_tokens: int = 0
    seed: int | None = None

    def validate(self) -> None:
        """Check value ranges (same rules and messages as SGLang's request validation).

        Raises:
            ProtocolError: a value out of range or of the wrong type.
        """
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise ProtocolError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
        if not is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ProtocolError(f"temperature must be a non-negative finite number, got {self.temperature}.")
        if not is_number(self.top_p) or not (0 < self.top_p <= 1):
            raise ProtocolError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not is_int(self.top_k) or (self.top_k < 1 and self.top_k != -1):
            raise ProtocolError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not is_int(self.min_new_tokens) or self.min_new_tokens < 0:
            raise ProtocolError(f"min_new_tokens must be at least 0, got {self.min_new_tokens}.")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list) or not all(is_int(t) for t in self.stop_token_ids):
                raise ProtocolError("stop_token_ids must be a list of int.")
        if not isinstance(self.ignore_eos, bool):
            raise ProtocolError(f"ignore_eos must be a bool, got {self.ignore_eos!r}.")
        if self.seed is not None and not is_int(self.seed):
            raise ProtocolError(f"sampling_seed must be an int, got {self.seed!r}.")

    def to_json(self) -> dict:
        """SGLang ``sampling_params`` dict (only SGLang-known keys; optional ones only when set)."""
        out: dict[str, Any] = {
            "max_new_tokens": int(self.max_new_tokens),
            "temperature": float(self.temperature),
            "top_p": float(self.top_p),
            "top_k": int(self.top_k),
            "ignore_eos": bool(self.ignore_eos),
        }
        if self.stop_token_ids is not None:
            out["stop_token_ids"] = [int(t) for t in self.stop_token_ids]
        if self.min_new_tokens:
            out["min_new_tokens"] = int(self.min_new_tokens)
        if self.seed is not None:
            out["sampling_seed"] = int(self.seed)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "SamplingParams":
        """Parse a ``sampling_params`` dict as the embedded server accepts it.

        Unknown keys are rejected (like SGLang). SGLang keys whose effect the embedded server does not
        implement are accepted only at their neutral value (e.g. ``frequency_penalty: 0``, ``n: 1``); other
        values are rejected rather than silently ignored. ``stop`` (strings) is rejected: send token ids.

        Raises:
            ProtocolError: bad key, type or value (message suitable for a 400 body).
        """
        if obj is None:
            obj = {}
        if not isinstance(obj, dict):
            raise ProtocolError(f"sampling_params must be an object, got {type(obj).__name__}.")
        unknown = [k for k in obj if k not in SGLANG_SAMPLING_KEYS]
        if unknown:
            raise ProtocolError(f"unknown field `{unknown[0]}`, expected one of "
                                + ", ".join(f"`{k}`" for k in sorted(SGLANG_SAMPLING_KEYS)))
        neutral = {"frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1, "min_p": 0, "n": 1}
        for k, v in neutral.items():
            if k in obj and obj[k] is not None and obj[k] != v:
                raise ProtocolError(f"sampling_params.{k}={obj[k]!r} is not supported by this server "
                                    f"(only {v}).")
        for k in ("stop", "stop_regex", "json_schema", "regex", "ebnf", "structural_tag", "logit_bias",
                  "custom_params"):
            if obj.get(k) not in (None, [], ""):
                hint = "; use stop_token_ids" if k == "stop" else ""
                raise ProtocolError(f"sampling_params.{k} is not supported by this server{hint}.")
        stop_ids = obj.get("stop_token_ids")
        if isinstance(stop_ids, int) and not isinstance(stop_ids, bool):
            stop_ids = [stop_ids]
        p = cls(
            max_new_tokens=obj.get("max_new_tokens", 128) if obj.get("max_new_tokens") is not None else 128,
            temperature=obj.get("temperature", 1.0) if obj.get("temperature") is not None else 1.0,
            top_p=obj.get("top_p", 1.0) if obj.get("top_p") is not None else 1.0,
            top_k=obj.get("top_k", -1) if obj.get("top_k") is not None else -1,
            stop_token_ids=list(stop_ids) if stop_ids is not None else None,
            ignore_eos=obj.get("ignore_eos", False) if obj.get("ignore_eos") is not None else False,
            min_new_tokens=obj.get("min_new_tokens", 0) if obj.get("min_new_tokens") is not None else 0,
            seed=obj.get("sampling_seed"),
        )
        p.validate()  # on the values as sent (messages quote them verbatim, like SGLang)
        p.temperature, p.top_p = float(p.temperature), float(p.top_p)
        return p


@dataclass
class GenerateRequest:
    """One ``POST /generate`` request with token ids (never text: token ids are used verbatim).

    Attributes:
        input_ids: prompt token ids (non-empty).
        sampling_params: see :class:`SamplingParams`.
        return_logprob: ask for ``output_token_logprobs``.
        rid: request id; SGLang echoes it as ``meta_info.id`` and ``/abort_request {rid}`` can target it.
        logprob_start_len: (added) SGLang's ``logprob_start_len``: -1 = no prompt logprobs; k >= 0 = prompt
            logprobs from position k (the entry of position 0 has logprob ``null``). Sent only when >= 0.
        return_text_in_logprobs: (added) third element of each logprob triple is the token text.
        extra_key: (added) SGLang's ``extra_key``: a namespace of the prefix (radix) cache; requests with
            different keys never share cached KV (checked on a real server: ``cached_tokens`` 5 with the same key,
            0 with another). The kit sends the policy version (:func:`cache_key`), so a request never reuses KV
            that older weights computed. Sent only when not None.
    """

    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = True
    rid: str | None = None
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False
    extra_key: str | None = None

    def to_json(self) -> dict:
        """SGLang ``/generate`` body for one prompt."""
        out: dict[str, Any] = {
            "input_ids": [int(t) for t in self.input_ids],
            "sampling_params": self.sampling_params.to_json(),
            "return_logprob": bool(self.return_logprob),
        }
        if self.rid is not None:
            out["rid"] = str(self.rid)
        if self.logprob_start_len >= 0:
            out["logprob_start_len"] = int(self.logprob_start_len)
        if self.return_text_in_logprobs:
            out["return_text_in_logprobs"] = True
        if self.extra_key is not None:
            out["extra_key"] = str(self.extra_key)
        return out


@dataclass
class BatchGenerateRequest:
    """One ``POST /generate`` request for a batch of prompts (``input_ids`` is a list of lists).

    The response is a JSON list in input order.

    Attributes:
        input_ids: one prompt (list of token ids) per entry.
        sampling_params: one :class:`SamplingParams` for all prompts, or one per prompt.
        return_logprob: ask for ``output_token_logprobs``.
        rids: one request id per prompt, or None.
        extra_key: the prefix-cache namespace of every prompt (see :class:`GenerateRequest`), or None.
    """

    input_ids: list[list[int]]
    sampling_params: SamplingParams | list[SamplingParams]
    return_logprob: bool = True
    rids: list[str] | None = None
    extra_key: str | None = None

    def to_json(self) -> dict:
        """SGLang ``/generate`` body for the batch.

        Raises:
            ValueError: ``rids`` (or a per-prompt ``sampling_params``) of another length than ``input_ids``.
        """
        n = len(self.input_ids)
        if isinstance(self.sampling_params, list):
            if len(self.sampling_params) != n:
                raise ValueError(f"sampling_params has {len(self.sampling_params)} entries for {n} prompts")
            sp: dict | list[dict] = [p.to_json() for p in self.sampling_params]
        else:
            sp = self.sampling_params.to_json()
        out: dict[str, Any] = {
            "input_ids": [[int(t) for t in ids] for ids in self.input_ids],
            "sampling_params": sp,
            "return_logprob": bool(self.return_logprob),
        }
        if self.rids is not None:
            if len(self.rids) != n:
                raise ValueError(f"rids has {len(self.rids)} entries for {n} prompts")
            out["rid"] = [str(r) for r in self.rids]
        if self.extra_key is not None:
            out["extra_key"] = str(self.extra_key)
        return out


def cache_key(version: int | None) -> str | None:
    """The ``extra_key`` of a request sent while the servers hold policy ``version`` (None: no key): requests of
    different versions never share prefix-cache entries."""
    return None if version is None else f"areal-v{int(version)}"


def build_generate_payload(input_ids: list[int], params: SamplingParams, *, return_logprob: bool = True,
                           rid: str | None = None) -> dict:
    """``POST /generate`` body for one prompt (pure; see :meth:`GenerateRequest.to_json`)."""
    return GenerateRequest(list(input_ids), params, return_logprob=return_logprob, rid=rid).to_json()


def build_batch_generate_payload(batch_input_ids: list[list[int]], params: SamplingParams, *,
                                 return_logprob: bool = True, rids: list[str] | None = None) -> dict:
    """``POST /generate`` body for a batch (``input_ids`` is a list of lists; one ``sampling_params`` for
    all). The response is a JSON list in input order. See :meth:`BatchGenerateRequest.to_json`."""
    return BatchGenerateRequest(list(batch_input_ids), params, return_logprob, rids).to_json()


def parse_generate_request(body: Any, *, vocab_size: int | None = None,
                           context_length: int | None = None) -> tuple[list[GenerateRequest], bool]:
    """Parse and validate a ``/generate`` body (server side).

    Args:
        body: the decoded JSON body.
        vocab_size: when given, every input id must lie in ``[0, vocab_size)`` (a real SGLang server
            crashes on out-of-range ids; the embedded server answers 400 instead).
        context_length: when given, ``len(input_ids) + max_new_tokens`` must not exceed it.
    Returns:
        ``(requests, is_batch)``: one :class:`GenerateRequest` per prompt; ``is_batch`` is True when
        ``input_ids`` was a list of lists (the response must then be a list).
    Raises:
        ProtocolError: message in SGLang's wording where SGLang has one.
    """
    if not isinstance(body, dict):
        raise ProtocolError("The request body must be a JSON object.")
    ids = body.get("input_ids")
    if ids is None:
        if body.get("text") is not None:
            raise ProtocolError("This server takes token ids only: send input_ids, not text.")
        raise ProtocolError("Either text, input_ids or input_embeds should be provided.")
    if body.get("stream"):
        raise ProtocolError("stream=true is not supported by this server.")
    if not isinstance(ids, list):
        raise ProtocolError("input_ids must be a list of int or a list of lists of int.")
    is_batch = len(ids) > 0 and all(isinstance(x, list) for x in ids)
    batch = ids if is_batch else [ids]
    n = len(batch)

    def per_item(key: str, default: Any) -> list[Any]:
        # In a batch every per-request field may be a list (one entry per prompt) or one shared value.
        v = body.get(key, default)
        if is_batch and isinstance(v, list):
            if len(v) != n:
                raise ProtocolError(f"{key} has {len(v)} entries for {n} prompts.")
            return list(v)
        return [v] * n

    sps = per_item("sampling_params", None)
    rids = per_item("rid", None)
    if is_batch and rids[0] is not None and not isinstance(body.get("rid"), list):
        raise ProtocolError("rid must be a list with one id per prompt for a batch.")
    rls = per_item("return_logprob", False)
    lsl = per_item("logprob_start_len", -1)
    rtl = per_item("return_text_in_logprobs", False)
    tln = per_item("top_logprobs_num", 0)
    eks = per_item("extra_key", None)
    out = []
    for i, prompt in enumerate(batch):
        if not isinstance(prompt, list) or not all(is_int(t) for t in prompt):
            raise ProtocolError("input_ids elements must be int (or lists of int for a batch).")
        if len(prompt) == 0:
            raise ProtocolError("input_ids cannot be empty.")
        if vocab_size is not None:
            for j, t in enumerate(prompt):
                if not 0 <= t < vocab_size:
                    raise ProtocolError(f"input_ids[{j}] = {t} is out of the vocabulary range "
                                        f"[0, {vocab_size}).")
        if tln[i] not in (None, 0):
            raise ProtocolError("top_logprobs_num > 0 is not supported by this server.")
        sp = SamplingParams.from_json(sps[i])
        if context_length is not None:
            if len(prompt) > context_length:
                raise ProtocolError(f"The input ({len(prompt)} tokens) is longer than the model's context "
                                    f"length ({context_length} tokens).")
            if len(prompt) + sp.max_new_tokens > context_length:
                raise ProtocolError(
                    f"Requested token count exceeds the model's maximum context length of {context_length} "
                    f"tokens. You requested a total of {len(prompt) + sp.max_new_tokens} tokens: "
                    f"{len(prompt)} tokens from the input messages and {sp.max_new_tokens} tokens for the "
                    f"completion. Please reduce the number of tokens in the input messages or the "
                    f"completion to fit within the limit.")
        rid = rids[i]
        if rid is not None and not isinstance(rid, str):
            raise ProtocolError("rid must be a string.")
        start = lsl[i] if lsl[i] is not None else -1
        if not is_int(start):
            raise ProtocolError("logprob_start_len must be an int.")
        if eks[i] is not None and not isinstance(eks[i], str):
            raise ProtocolError("extra_key must be a string (or a list of strings for a batch).")
        out.append(GenerateRequest(
            input_ids=[int(t) for t in prompt], sampling_params=sp, return_logprob=bool(rls[i]), rid=rid,
            logprob_start_len=int(start), return_text_in_logprobs=bool(rtl[i]), extra_key=eks[i] or None,
        ))
    return out, is_batch
