"""The one wire format between rollout clients and inference servers: SGLang's native HTTP protocol.

Everything here is pure (no I/O, no torch): dataclasses, payload builders and parsers, used by the client
(:mod:`areal_cli.rollout.client`), the embedded server (:mod:`areal_cli.rollout.server`), the trainer's weight
sender (:mod:`areal_cli.rollout.weight_sender`) and the tests.

Shapes follow the recordings of a real SGLang 0.5.23 server in ``shared/fixtures/sglang`` of the workspace (README
there; DESIGN.md §2):

- ``POST /generate`` body: ``{input_ids: [int] | [[int]], sampling_params: {...}, return_logprob, rid?}``.
- Response (a list for a batch): ``{text, output_ids, meta_info: {id, finish_reason, prompt_tokens,
  completion_tokens, output_token_logprobs: [[logprob, token_id, text|null], ...], weight_version,
  weight_versions: [{version, start, end}], ...}}``.
- ``finish_reason``: ``{"type": "length", "length": n}``, ``{"type": "stop", "matched": int | str}``,
  ``{"type": "abort", "message": "Aborted", ...}`` (aborts come with HTTP 200 and partial output).
- Error bodies: ``{"error": {"message": str}}``, ``{"error": str}``,
  ``{"object": "error", "message": str, ...}``, ``{"success": false, "message": str}`` (weight update) or a
  plain-text body (``/flush_cache``); :func:`parse_error_message` turns any of them into one string.
- Control: ``/pause_generation {mode}``, ``/continue_generation {}``, ``/update_weights_from_disk {model_path,
  weight_version?, abort_all_requests?}``, ``/abort_request {rid} | {abort_all: true}``.

Weight updates over a collective (:mod:`areal_cli.rollout.weight_sync`). No recording of these endpoints exists
in ``shared/fixtures/sglang``; the field names and types are those of SGLang's
``python/sglang/srt/managers/io_struct.py``, sgl-project/sglang main:

- ``InitWeightsUpdateGroupReqInput``: ``master_address: str, master_port: int, rank_offset: int,
  world_size: int, group_name: str = "weight_update_group", backend: str = "nccl"``. AReaL sends
  ``master_port`` as a string (pydantic coerces it); we do too, and parse both.
- ``UpdateWeightsFromDistributedReqInput``: ``names: List[str], dtypes: List[str], shapes: List[List[int]],
  group_name = "weight_update_group", flush_cache = True, abort_all_requests = False,
  weight_version: Optional[str] = None, load_format: Optional[str] = None, torch_empty_cache = False``.
  ``dtypes`` are torch dtype names without the ``torch.`` prefix (``"bfloat16"``, ``"float32"``).
- ``DestroyWeightsUpdateGroupReqInput``: ``group_name = "weight_update_group"``.
- Replies (``*ReqOutput``): ``{"success": bool, "message": str}``, HTTP 200 or 400.

Each message is a dataclass with ``to_json()`` (what a client sends) and, where a server parses it,
``from_json()`` (raising :class:`ProtocolError` with the message the server answers); the ``build_*_payload``
and ``parse_*`` functions are those methods in function form. This file holds the wire format and nothing else.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

# Keys of SGLang's ``sampling_params`` schema (0.5.23; from the recorded "unknown field" error, which lists
# the allowed keys, plus ``sampling_seed``). Anything else is rejected by SGLang with HTTP 400.
SGLANG_SAMPLING_KEYS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params",
})

ABORT_FINISH_REASON: dict[str, Any] = {"type": "abort", "message": "Aborted", "status_code": None,
                                       "err_type": None}


class ProtocolError(ValueError):
    """A request or response body that does not follow the protocol (bad field, bad type, bad value).

    For requests the message is what the server returns to the client in ``{"error": {"message": ...}}``.
    """


class ServerError(RuntimeError):
    """An inference server answered with an HTTP error status.

    Attributes:
        status: HTTP status code (int), or None when no response came back.
        message: the server's error message, extracted by :func:`parse_error_message`.
        url: the server URL (may be "").
    """

    def __init__(self, status: int | None, message: str, url: str = ""):
        self.status = status
        self.message = message
        self.url = url
        where = f" from {url}" if url else ""
        super().__init__(f"HTTP {status}{where}: {message}")


# ----------------------------------------------------------------------------------------------------------
# Requests
# ----------------------------------------------------------------------------------------------------------


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
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise ProtocolError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ProtocolError(f"temperature must be a non-negative finite number, got {self.temperature}.")
        if not _is_number(self.top_p) or not (0 < self.top_p <= 1):
            raise ProtocolError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not _is_int(self.top_k) or (self.top_k < 1 and self.top_k != -1):
            raise ProtocolError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not _is_int(self.min_new_tokens) or self.min_new_tokens < 0:
            raise ProtocolError(f"min_new_tokens must be at least 0, got {self.min_new_tokens}.")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list) or not all(_is_int(t) for t in self.stop_token_ids):
                raise ProtocolError("stop_token_ids must be a list of int.")
        if not isinstance(self.ignore_eos, bool):
            raise ProtocolError(f"ignore_eos must be a bool, got {self.ignore_eos!r}.")
        if self.seed is not None and not _is_int(self.seed):
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
    """

    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = True
    rid: str | None = None
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False

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
    """

    input_ids: list[list[int]]
    sampling_params: SamplingParams | list[SamplingParams]
    return_logprob: bool = True
    rids: list[str] | None = None

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
        return out


PAUSE_MODES = ("abort", "retract", "in_place")


@dataclass
class PauseGenerationRequest:
    """``POST /pause_generation`` body (SGLang ``PauseGenerationReqInput``).

    Attributes:
        mode: "abort" (SGLang's default): in-flight requests return at once with finish_reason abort and
            their partial output; "retract": their KV is dropped and they stay queued; "in_place": the server
            just stops stepping. New ``/generate`` requests wait until ``/continue_generation``.
    """

    mode: str = "abort"

    def to_json(self) -> dict:
        """``{"mode": mode}``."""
        return {"mode": self.mode}

    @classmethod
    def from_json(cls, obj: Any) -> "PauseGenerationRequest":
        """Parse a decoded body (None or empty -> mode "abort").

        Raises:
            ProtocolError: not an object, or an unknown mode.
        """
        obj = obj or {}
        if not isinstance(obj, dict):
            raise ProtocolError("pause_generation body must be a JSON object")
        mode = obj.get("mode", "abort") or "abort"
        if mode not in PAUSE_MODES:
            raise ProtocolError(f"Invalid mode {mode!r}: expected abort, retract or in_place.")
        return cls(mode)


@dataclass
class ContinueGenerationRequest:
    """``POST /continue_generation`` body (SGLang ``ContinueGenerationReqInput``): an empty object."""

    def to_json(self) -> dict:
        """``{}``."""
        return {}


@dataclass
class UpdateWeightsFromDiskRequest:
    """``POST /update_weights_from_disk`` body (SGLang ``UpdateWeightFromDiskReqInput``).

    Attributes:
        model_path: Hugging Face model directory to load.
        weight_version: the version label after the load (sent only when not None).
        abort_all_requests: True aborts in-flight requests first; False (or None: not sent, SGLang's default)
            lets them finish while new ones wait.
        flush_cache: False keeps SGLang from flushing its prefix cache after the load (None: not sent, SGLang's
            default True). An in-place update must send False: SGLang asserts that the flush succeeds, and a
            flush fails while requests are running (in place, they are).
    """

    model_path: str
    weight_version: str | None = None
    abort_all_requests: bool | None = None
    flush_cache: bool | None = None

    def to_json(self) -> dict:
        """``{model_path, weight_version?, abort_all_requests?, flush_cache?}``."""
        out: dict[str, Any] = {"model_path": str(self.model_path)}
        if self.weight_version is not None:
            out["weight_version"] = str(self.weight_version)
        if self.abort_all_requests is not None:
            out["abort_all_requests"] = bool(self.abort_all_requests)
        if self.flush_cache is not None:
            out["flush_cache"] = bool(self.flush_cache)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "UpdateWeightsFromDiskRequest":
        """Parse a decoded body (server side).

        Raises:
            ProtocolError: not an object, or no ``model_path`` string.
        """
        if not isinstance(obj, dict) or not isinstance(obj.get("model_path"), str):
            raise ProtocolError("model_path (a string) is required.")
        wv, abort, flush = obj.get("weight_version"), obj.get("abort_all_requests"), obj.get("flush_cache")
        return cls(obj["model_path"], None if wv is None else str(wv), None if abort is None else bool(abort),
                   None if flush is None else bool(flush))


@dataclass
class AbortRequest:
    """``POST /abort_request`` body: ``{"rid": rid}`` or ``{"abort_all": true}`` (SGLang ``AbortReq``).

    Attributes:
        rid: the request to abort (ignored when ``abort_all``).
        abort_all: abort every request.
    """

    rid: str | None = None
    abort_all: bool = False

    def to_json(self) -> dict:
        """``{"abort_all": true}`` or ``{"rid": rid}``.

        Raises:
            ValueError: neither a rid nor abort_all.
        """
        if self.abort_all:
            return {"abort_all": True}
        if self.rid is None:
            raise ValueError("give a rid or abort_all=True")
        return {"rid": str(self.rid)}

    @classmethod
    def from_json(cls, obj: Any) -> "AbortRequest":
        """Parse a decoded body (server side; neither field: nothing to abort).

        Raises:
            ProtocolError: not an object.
        """
        if not isinstance(obj, dict):
            raise ProtocolError("body must be an object")
        rid = obj.get("rid")
        return cls(None if rid is None else str(rid), bool(obj.get("abort_all")))


@dataclass
class UpdateWeightVersionRequest:
    """``POST /update_weight_version`` body (SGLang ``UpdateWeightVersionReqInput``): relabel the loaded weights.

    Attributes:
        new_version: the new weight-version label.
        abort_all_requests: abort in-flight requests first.
    """

    new_version: str
    abort_all_requests: bool = False

    def to_json(self) -> dict:
        """``{"new_version", "abort_all_requests"}``."""
        return {"new_version": str(self.new_version), "abort_all_requests": bool(self.abort_all_requests)}

    @classmethod
    def from_json(cls, obj: Any) -> "UpdateWeightVersionRequest":
        """Parse a decoded body (server side; ``new_version`` of any JSON type is taken as its ``str``).

        Raises:
            ProtocolError: no ``new_version`` (the message is Python's for the failed lookup).
        """
        try:
            new = obj["new_version"]
        except (KeyError, TypeError) as e:
            raise ProtocolError(str(e)) from None
        return cls(str(new), bool(obj.get("abort_all_requests")))


def build_generate_payload(input_ids: list[int], params: SamplingParams, *, return_logprob: bool = True,
                           rid: str | None = None) -> dict:
    """``POST /generate`` body for one prompt (pure; see :meth:`GenerateRequest.to_json`)."""
    return GenerateRequest(list(input_ids), params, return_logprob=return_logprob, rid=rid).to_json()


def build_batch_generate_payload(batch_input_ids: list[list[int]], params: SamplingParams, *,
                                 return_logprob: bool = True, rids: list[str] | None = None) -> dict:
    """``POST /generate`` body for a batch (``input_ids`` is a list of lists; one ``sampling_params`` for
    all). The response is a JSON list in input order. See :meth:`BatchGenerateRequest.to_json`."""
    return BatchGenerateRequest(list(batch_input_ids), params, return_logprob, rids).to_json()


def build_pause_payload(mode: str = "abort") -> dict:
    """``POST /pause_generation`` body. ``mode`` in {"abort", "retract", "in_place"}; SGLang's default is
    "abort" (in-flight requests return at once with finish_reason abort and their partial output)."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode must be abort, retract or in_place, got {mode!r}")
    return PauseGenerationRequest(mode).to_json()


def build_continue_payload() -> dict:
    """``POST /continue_generation`` body (empty object)."""
    return ContinueGenerationRequest().to_json()


def build_update_weights_from_disk_payload(model_path: str, weight_version: str | None = None,
                                           abort_all_requests: bool | None = None) -> dict:
    """``POST /update_weights_from_disk`` body: ``{model_path, weight_version?, abort_all_requests?}``."""
    return UpdateWeightsFromDiskRequest(model_path, None if weight_version is None else str(weight_version),
                                        abort_all_requests).to_json()


def build_abort_payload(rid: str | None = None, abort_all: bool = False) -> dict:
    """``POST /abort_request`` body: ``{"rid": rid}`` or ``{"abort_all": true}``."""
    return AbortRequest(rid, abort_all).to_json()


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
    out = []
    for i, prompt in enumerate(batch):
        if not isinstance(prompt, list) or not all(_is_int(t) for t in prompt):
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
        if not _is_int(start):
            raise ProtocolError("logprob_start_len must be an int.")
        out.append(GenerateRequest(
            input_ids=[int(t) for t in prompt], sampling_params=sp, return_logprob=bool(rls[i]), rid=rid,
            logprob_start_len=int(start), return_text_in_logprobs=bool(rtl[i]),
        ))
    return out, is_batch


# ----------------------------------------------------------------------------------------------------------
# Weight updates over a collective (trainer -> servers)
# ----------------------------------------------------------------------------------------------------------

DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's default group_name

# torch dtype name (str(torch.dtype) without "torch.") -> bytes per element
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


@dataclass(frozen=True)
class ParamSpec:
    """One tensor of a weight update, as it travels in the payload.

    Attributes:
        name: Hugging Face parameter name (``model.layers.0.mlp.up_proj.weight``).
        shape: tensor shape.
        dtype: torch dtype name without ``torch.`` (``"bfloat16"``, ``"float32"``), a key of DTYPE_BYTES.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Size in bytes (numel * element size)."""
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class InitWeightsUpdateGroupRequest:
    """``POST /init_weights_update_group`` body (SGLang ``InitWeightsUpdateGroupReqInput``).

    Attributes:
        master_address, master_port: the rendezvous (a TCPStore hosted by the trainer's head rank, rank 0).
        rank_offset: rank of this server's first process in the group (in ``[1, world_size)``).
        world_size: the trainer head rank + every server process.
        group_name: SGLang's group name. backend: "nccl" | "gloo".
    """

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = "nccl"

    def to_json(self) -> dict:
        """The body; ``master_port`` is sent as a string, as AReaL does (SGLang's pydantic coerces it)."""
        return {"master_address": str(self.master_address), "master_port": str(int(self.master_port)),
                "rank_offset": int(self.rank_offset), "world_size": int(self.world_size),
                "group_name": str(self.group_name), "backend": str(self.backend)}

    @classmethod
    def from_json(cls, body: Any) -> "InitWeightsUpdateGroupRequest":
        """Parse and check a decoded body (server side); ``master_port`` as an int or a digit string.

        Raises:
            ProtocolError: missing/ill-typed field, port outside 1..65535, rank_offset outside [1, world_size).
        """
        if not isinstance(body, dict):
            raise ProtocolError("The request body must be a JSON object.")
        req = cls(
            master_address=_str_field(body, "master_address"),
            master_port=_int_field(body, "master_port", lo=1),
            rank_offset=_int_field(body, "rank_offset", lo=0),
            world_size=_int_field(body, "world_size", lo=2),
            group_name=_str_field(body, "group_name", DEFAULT_GROUP_NAME),
            backend=_str_field(body, "backend", "nccl"),
        )
        if req.master_port > 65535:
            raise ProtocolError(f"master_port must be in 1..65535, got {req.master_port}")
        if not 1 <= req.rank_offset < req.world_size:
            raise ProtocolError(f"rank_offset {req.rank_offset} must be in [1, world_size={req.world_size}) "
                                f"(rank 0 is the trainer)")
        return req


@dataclass(frozen=True)
class UpdateWeightsFromDistributedRequest:
    """``POST /update_weights_from_distributed`` body (SGLang ``UpdateWeightsFromDistributedReqInput``): one
    bucket of tensors, then broadcast from rank 0 in this order.

    Attributes:
        specs: name, shape and dtype of each tensor (``names``, ``shapes``, ``dtypes`` on the wire).
        group_name: the group the tensors come over.
        weight_version: the version label after this bucket loads (the last bucket of an update), else None.
        abort_all_requests: abort in-flight requests first (SGLang's default False: let them finish).
        flush_cache: SGLang flushes its prefix cache after the load (default True).
        extra: other fields of a parsed body (``load_format``, ``torch_empty_cache``, ...), sent back as is.
    """

    specs: list[ParamSpec]
    group_name: str = DEFAULT_GROUP_NAME
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """``{names, dtypes, shapes, group_name, flush_cache, abort_all_requests, weight_version?}``; ``dtypes``
        are torch dtype names without the ``torch.`` prefix."""
        out: dict[str, Any] = {
            "names": [s.name for s in self.specs],
            "dtypes": [s.dtype for s in self.specs],
            "shapes": [list(s.shape) for s in self.specs],
            "group_name": str(self.group_name),
            "flush_cache": bool(self.flush_cache),
            "abort_all_requests": bool(self.abort_all_requests),
        }
        if self.weight_version is not None:
            out["weight_version"] = str(self.weight_version)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, body: Any) -> "UpdateWeightsFromDistributedRequest":
        """Parse and check a decoded body (server side).

        Raises:
            ProtocolError: names/dtypes/shapes missing, of different lengths, an unknown dtype, a negative
                dimension, a duplicate name; ill-typed optional fields.
        """
        if not isinstance(body, dict):
            raise ProtocolError("The request body must be a JSON object.")
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        for key, v in (("names", names), ("dtypes", dtypes), ("shapes", shapes)):
            if not isinstance(v, list) or not v:
                raise ProtocolError(f"{key} must be a non-empty list, got {v!r}")
        if not len(names) == len(dtypes) == len(shapes):
            raise ProtocolError(f"names, dtypes and shapes must have the same length "
                                f"({len(names)}, {len(dtypes)}, {len(shapes)})")
        specs: list[ParamSpec] = []
        seen: set[str] = set()
        for i, (n, d, s) in enumerate(zip(names, dtypes, shapes)):
            if not isinstance(n, str) or not n:
                raise ProtocolError(f"names[{i}] must be a non-empty string, got {n!r}")
            if n in seen:
                raise ProtocolError(f"names[{i}] = {n!r} appears twice")
            seen.add(n)
            if not isinstance(d, str) or d.removeprefix("torch.") not in DTYPE_BYTES:
                raise ProtocolError(f"dtypes[{i}] = {d!r} is not a supported dtype "
                                    f"({', '.join(sorted(DTYPE_BYTES))})")
            if not isinstance(s, list) or not all(_is_int(x) and x >= 0 for x in s):
                raise ProtocolError(f"shapes[{i}] = {s!r} must be a list of non-negative ints")
            specs.append(ParamSpec(n, tuple(s), d.removeprefix("torch.")))
        wv = body.get("weight_version")
        if wv is not None and not isinstance(wv, (str, int)) or isinstance(wv, bool):
            raise ProtocolError(f"weight_version must be a string, got {wv!r}")
        if body.get("load_format") not in (None, "", "auto"):
            raise ProtocolError(f"load_format {body.get('load_format')!r} is not supported by this server")
        known = {"names", "dtypes", "shapes", "group_name", "weight_version", "abort_all_requests",
                 "flush_cache", "load_format"}
        return cls(
            specs=specs,
            group_name=_str_field(body, "group_name", DEFAULT_GROUP_NAME),
            weight_version=None if wv is None else str(wv),
            abort_all_requests=_bool_field(body, "abort_all_requests", False),
            flush_cache=_bool_field(body, "flush_cache", True),
            extra={k: v for k, v in body.items() if k not in known},
        )


@dataclass(frozen=True)
class DestroyWeightsUpdateGroupRequest:
    """``POST /destroy_weights_update_group`` body (SGLang ``DestroyWeightsUpdateGroupReqInput``)."""

    group_name: str = DEFAULT_GROUP_NAME

    def to_json(self) -> dict:
        """``{"group_name": group_name}``."""
        return {"group_name": str(self.group_name)}

    @classmethod
    def from_json(cls, body: Any) -> "DestroyWeightsUpdateGroupRequest":
        """Parse a decoded body (None or ``{}`` -> the default name).

        Raises:
            ProtocolError: not an object or a bad group_name.
        """
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ProtocolError("The request body must be a JSON object.")
        return cls(_str_field(body, "group_name", DEFAULT_GROUP_NAME))


@dataclass(frozen=True)
class WeightUpdateReply:
    """Reply to every weight-update request (SGLang's ``*ReqOutput``): ``{"success", "message"}``, HTTP 200 or
    400; ``/update_weights_from_disk`` adds ``num_paused_requests``.

    Attributes:
        success: the update (or group operation) was done.
        message: what the server says (SGLang's wording).
        num_paused_requests: sent only when not None.
    """

    success: bool
    message: str
    num_paused_requests: int | None = None

    def to_json(self) -> dict:
        """``{"success", "message", "num_paused_requests"?}``."""
        out: dict[str, Any] = {"success": bool(self.success), "message": str(self.message)}
        if self.num_paused_requests is not None:
            out["num_paused_requests"] = int(self.num_paused_requests)
        return out


def build_init_weights_update_group_payload(master_address: str, master_port: int | str, rank_offset: int,
                                            world_size: int, group_name: str = DEFAULT_GROUP_NAME,
                                            backend: str = "nccl") -> dict:
    """``POST /init_weights_update_group`` body (see :class:`InitWeightsUpdateGroupRequest`).

    ``master_port`` is sent as a string, as AReaL does.

    Raises:
        ValueError: rank_offset outside ``[1, world_size)``, port outside 1..65535, empty address/name.
    """
    port = int(master_port)
    if not 0 < port < 65536:
        raise ValueError(f"master_port must be in 1..65535, got {master_port!r}")
    if not 1 <= int(rank_offset) < int(world_size):
        raise ValueError(f"rank_offset {rank_offset} must be in [1, world_size={world_size})")
    if not master_address or not group_name:
        raise ValueError("master_address and group_name must be non-empty")
    return InitWeightsUpdateGroupRequest(str(master_address), port, int(rank_offset), int(world_size),
                                         str(group_name), str(backend)).to_json()


def build_update_weights_from_distributed_payload(specs: Sequence[ParamSpec],
                                                  group_name: str = DEFAULT_GROUP_NAME,
                                                  weight_version: str | int | None = None,
                                                  abort_all_requests: bool = True,
                                                  flush_cache: bool = True) -> dict:
    """``POST /update_weights_from_distributed`` body (see :class:`UpdateWeightsFromDistributedRequest`):
    ``{names, dtypes, shapes, group_name, flush_cache, abort_all_requests, weight_version?}``.

    Raises:
        ValueError: no specs.
    """
    if not specs:
        raise ValueError("a weight update needs at least one tensor")
    return UpdateWeightsFromDistributedRequest(
        list(specs), str(group_name), None if weight_version is None else str(weight_version),
        bool(abort_all_requests), bool(flush_cache)).to_json()


def build_destroy_weights_update_group_payload(group_name: str = DEFAULT_GROUP_NAME) -> dict:
    """``POST /destroy_weights_update_group`` body (SGLang ``DestroyWeightsUpdateGroupReqInput``)."""
    return DestroyWeightsUpdateGroupRequest(str(group_name)).to_json()


def parse_init_weights_update_group_request(body: Any) -> InitWeightsUpdateGroupRequest:
    """Parse and check an ``/init_weights_update_group`` body (server side); see
    :meth:`InitWeightsUpdateGroupRequest.from_json`."""
    return InitWeightsUpdateGroupRequest.from_json(body)


def parse_update_weights_from_distributed_request(body: Any) -> UpdateWeightsFromDistributedRequest:
    """Parse and check an ``/update_weights_from_distributed`` body (server side); see
    :meth:`UpdateWeightsFromDistributedRequest.from_json`."""
    return UpdateWeightsFromDistributedRequest.from_json(body)


def parse_destroy_weights_update_group_request(body: Any) -> str:
    """Group name of a ``/destroy_weights_update_group`` body (``{}`` -> the default name).

    Raises:
        ProtocolError: not an object or a bad group_name.
    """
    return DestroyWeightsUpdateGroupRequest.from_json(body).group_name


def _int_field(body: dict, key: str, *, lo: int | None = None) -> int:
    v = body.get(key)
    if isinstance(v, str) and v.strip().isdigit():  # pydantic's lax mode takes "29500" for an int
        v = int(v)
    if not _is_int(v):
        raise ProtocolError(f"{key} must be an int, got {v!r}")
    if lo is not None and v < lo:
        raise ProtocolError(f"{key} must be >= {lo}, got {v}")
    return int(v)


def _str_field(body: dict, key: str, default: str | None = None) -> str:
    v = body.get(key, default)
    if not isinstance(v, str) or not v:
        raise ProtocolError(f"{key} must be a non-empty string, got {v!r}")
    return v


def _bool_field(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ProtocolError(f"{key} must be a bool, got {v!r}")
    return v


# ----------------------------------------------------------------------------------------------------------
# Responses
# ----------------------------------------------------------------------------------------------------------


@dataclass
class GenerateResponse:
    """One parsed ``/generate`` result (real SGLang or embedded server).

    Attributes:
        rid: ``meta_info.id``.
        text: decoded output (stop/EOS tokens left out, as SGLang does).
        output_ids: generated token ids; a matched stop/EOS token is the last element.
        output_logprobs: logprob of each output token (same length as ``output_ids`` when the request asked
            for logprobs, else empty). Units: natural log.
        finish_reason: "stop" | "length" | "abort".
        matched_stop: the matched stop token id (int) or stop string (str); None otherwise.
        prompt_tokens, completion_tokens: token counts reported by the server.
        weight_version: ``meta_info.weight_version`` (version at finish; SGLang's initial is "default").
        weight_version_spans: ``(version, start, end)`` over output positions, end exclusive.
        input_token_logprobs: (added) prompt logprobs when requested (first entry None), else [].
        cached_tokens, e2e_latency, num_retractions: (added) server statistics (0 / None when absent).
        finish_message: (added) ``finish_reason.message`` (e.g. "Aborted"), else None.
    """

    rid: str
    text: str
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    matched_stop: int | str | None
    prompt_tokens: int
    completion_tokens: int
    weight_version: str
    weight_version_spans: list[tuple[str, int, int]]
    input_token_logprobs: list[float | None] = field(default_factory=list)
    cached_tokens: int = 0
    e2e_latency: float | None = None
    num_retractions: int = 0
    finish_message: str | None = None

    @classmethod
    def from_json(cls, obj: dict) -> "GenerateResponse":
        """Parse one ``/generate`` result object.

        Accepts real SGLang responses (logprob triples ``[lp, id, text|null]``, ``weight_versions`` spans,
        missing ``output_token_logprobs`` when logprobs were not requested, prompt logprobs with a leading
        ``null``) and the embedded server's (same shape).

        Raises:
            ServerError: the object is an error body (``{"error": ...}`` etc.).
            ProtocolError: missing/ill-typed fields, or logprob ids that disagree with ``output_ids``.
        """
        if not isinstance(obj, dict):
            raise ProtocolError(f"generate response must be an object, got {type(obj).__name__}")
        if is_error_body(obj):
            raise ServerError(None, parse_error_message(obj))
        meta = obj.get("meta_info")
        if not isinstance(meta, dict):
            raise ProtocolError("generate response has no meta_info object")
        triples = meta.get("output_token_logprobs")
        ids_raw = obj.get("output_ids")
        if ids_raw is None and triples is None:
            raise ProtocolError("generate response has neither output_ids nor output_token_logprobs")
        lp_ids: list[int] = []
        logprobs: list[float] = []
        if triples is not None:
            if not isinstance(triples, list):
                raise ProtocolError("meta_info.output_token_logprobs must be a list")
            for t in triples:
                if not isinstance(t, (list, tuple)) or len(t) < 2 or not _is_number(t[0]) or not _is_int(t[1]):
                    raise ProtocolError(f"bad output_token_logprobs entry {t!r} (want [logprob, id, text])")
                logprobs.append(float(t[0]))
                lp_ids.append(int(t[1]))
        if ids_raw is None:
            output_ids = lp_ids
        else:
            if not isinstance(ids_raw, list) or not all(_is_int(t) for t in ids_raw):
                raise ProtocolError("output_ids must be a list of int")
            output_ids = [int(t) for t in ids_raw]
            if triples is not None and lp_ids != output_ids:
                raise ProtocolError(f"output_token_logprobs ids ({len(lp_ids)}) disagree with output_ids "
                                    f"({len(output_ids)})")
        fr = meta.get("finish_reason")
        if isinstance(fr, str):
            fr = {"type": fr}
        if not isinstance(fr, dict) or fr.get("type") not in ("stop", "length", "abort"):
            raise ProtocolError(f"bad meta_info.finish_reason {fr!r}")
        matched = fr.get("matched") if fr["type"] == "stop" else None
        wv = meta.get("weight_version")
        wv = "default" if wv is None else str(wv)
        spans_raw = meta.get("weight_versions")
        if spans_raw is None:
            spans = [(wv, 0, len(output_ids))]
        else:
            if not isinstance(spans_raw, list):
                raise ProtocolError("meta_info.weight_versions must be a list")
            spans = []
            for s in spans_raw:
                if not isinstance(s, dict) or not _is_int(s.get("start")) or not _is_int(s.get("end")):
                    raise ProtocolError(f"bad weight_versions entry {s!r}")
                spans.append((str(s.get("version")), int(s["start"]), int(s["end"])))
        itl_raw = meta.get("input_token_logprobs") or []
        itl: list[float | None] = []
        for t in itl_raw:
            if isinstance(t, (list, tuple)) and t and (t[0] is None or _is_number(t[0])):
                itl.append(None if t[0] is None else float(t[0]))
            else:
                raise ProtocolError(f"bad input_token_logprobs entry {t!r}")
        rid = meta.get("id")
        return cls(
            rid="" if rid is None else str(rid),
            text=str(obj.get("text") or ""),
            output_ids=output_ids,
            output_logprobs=logprobs,
            finish_reason=fr["type"],
            matched_stop=matched,
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            completion_tokens=int(meta["completion_tokens"]) if meta.get("completion_tokens") is not None
            else len(output_ids),
            weight_version=wv,
            weight_version_spans=spans,
            input_token_logprobs=itl,
            cached_tokens=int(meta.get("cached_tokens") or 0),
            e2e_latency=float(meta["e2e_latency"]) if _is_number(meta.get("e2e_latency")) else None,
            num_retractions=int(meta.get("num_retractions") or 0),
            finish_message=fr.get("message"),
        )

    def token_versions(self) -> list[str]:
        """Version label of each output token (from the spans; see :func:`versions_from_spans`)."""
        return versions_from_spans(self.weight_version_spans, len(self.output_ids), self.weight_version)


def parse_generate_response(obj: dict | list) -> GenerateResponse | list[GenerateResponse]:
    """Parse a ``/generate`` response body: an object for one prompt, a list for a batch.

    Raises:
        ServerError: an error body. ProtocolError: a malformed body.
    """
    if isinstance(obj, list):
        return [GenerateResponse.from_json(o) for o in obj]
    return GenerateResponse.from_json(obj)


def version_to_int(v: str | int) -> int:
    """Policy version number of a server weight-version label.

    ``"3"`` -> 3, ``"v3"`` -> 3, SGLang's initial ``"default"`` -> 0; ints pass through.

    Raises:
        ValueError: any other label (e.g. "abc", "-1").
    """
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 0:
            raise ValueError(f"weight version must be >= 0, got {v}")
        return v
    s = str(v).strip()
    if s == "default":
        return 0
    m = re.fullmatch(r"v?(\d+)", s)
    if not m:
        raise ValueError(f"weight version label {v!r} is not an integer (want '3', 'v3' or 'default')")
    return int(m.group(1))


def versions_from_spans(spans: list[tuple[str, int, int]], n: int, fallback: str | None = None) -> list[str]:
    """Expand ``(version, start, end)`` spans into one label per output position ``0..n-1``.

    Spans must be contiguous from 0 and end at ``n``; with no spans (or only empty ones) and ``n`` > 0 every
    token gets ``fallback``.

    Raises:
        ProtocolError: spans that do not tile ``[0, n)``, or no spans and no fallback.
    """
    nonempty = [s for s in spans if s[2] > s[1]]
    if not nonempty:
        if n == 0:
            return []
        if fallback is None:
            raise ProtocolError(f"no weight_versions spans for {n} output tokens")
        return [fallback] * n
    out: list[str] = []
    pos = 0
    for version, start, end in nonempty:
        if start != pos:
            raise ProtocolError(f"weight_versions spans {spans} do not tile [0, {n})")
        out.extend([version] * (end - start))
        pos = end
    if pos != n:
        raise ProtocolError(f"weight_versions spans {spans} cover [0, {pos}) but there are {n} output tokens")
    return out


def spans_from_versions(versions: list[str], current: str) -> list[dict]:
    """Run-length encode per-token version labels into SGLang's ``weight_versions`` list.

    ``["0","0","1"]`` -> ``[{"version": "0", "start": 0, "end": 2}, {"version": "1", "start": 2, "end": 3}]``;
    no tokens -> ``[{"version": current, "start": 0, "end": 0}]`` (as SGLang reports ``max_new_tokens: 0``).
    """
    if not versions:
        return [{"version": current, "start": 0, "end": 0}]
    spans: list[dict] = []
    for i, v in enumerate(versions):
        if spans and spans[-1]["version"] == v:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": v, "start": i, "end": i + 1})
    return spans


def finish_reason_json(kind: str, *, matched: int | str | None = None, length: int | None = None,
                       message: str = "Aborted") -> dict:
    """SGLang ``meta_info.finish_reason`` object for "stop" / "length" / "abort"."""
    if kind == "stop":
        return {"type": "stop", "matched": matched}
    if kind == "length":
        return {"type": "length", "length": int(length or 0)}
    if kind == "abort":
        return {**ABORT_FINISH_REASON, "message": message}
    raise ValueError(f"finish reason must be stop, length or abort, got {kind!r}")


def build_generate_response(*, rid: str, text: str, output_ids: list[int], output_logprobs: list[float],
                            finish_reason: dict, prompt_tokens: int, weight_version: str,
                            token_versions: list[str], return_logprob: bool = True,
                            input_token_logprobs: list[tuple[float | None, int]] | None = None,
                            token_texts: list[str] | None = None, input_token_texts: list[str] | None = None,
                            e2e_latency: float = 0.0, num_retractions: int = 0,
                            sent_ts: float | None = None) -> dict:
    """Build one SGLang-shaped ``/generate`` result object (what the embedded server returns).

    Args:
        output_logprobs: one float per output token (natural log).
        token_versions: version label of each output token (-> ``weight_versions`` spans).
        input_token_logprobs: ``(logprob|None, id)`` per prompt position from ``logprob_start_len``.
        token_texts / input_token_texts: third element of the triples (else null).
    """
    if len(output_logprobs) != len(output_ids) or len(token_versions) != len(output_ids):
        raise ValueError("output_ids, output_logprobs and token_versions must have the same length")
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": int(prompt_tokens),
        "weight_version": weight_version,
        "num_retractions": int(num_retractions),
    }
    if return_logprob:
        tt = token_texts or [None] * len(output_ids)
        itl = input_token_logprobs or []
        itt = input_token_texts or [None] * len(itl)
        meta["input_token_logprobs"] = [[lp, int(t), x] for (lp, t), x in zip(itl, itt)]
        meta["output_token_logprobs"] = [[float(lp), int(t), x]
                                         for lp, t, x in zip(output_logprobs, output_ids, tt)]
        meta["output_token_logprobs_length"] = len(output_ids)
    meta.update({
        "reasoning_tokens": 0,
        "completion_tokens": len(output_ids),
        "cached_tokens": 0,
        "weight_versions": spans_from_versions(token_versions, weight_version),
        "cached_tokens_details": None,
        "dp_rank": None,
        "e2e_latency": float(e2e_latency),
    })
    if sent_ts is not None:
        meta["response_sent_to_client_ts"] = float(sent_ts)
    return {"text": text, "output_ids": [int(t) for t in output_ids], "meta_info": meta}


# ----------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------


def is_error_body(obj: Any) -> bool:
    """True for the error shapes: ``{"error": ...}``, ``{"object": "error", ...}``, ``{"success": false}``."""
    return isinstance(obj, dict) and ("error" in obj or obj.get("object") == "error"
                                      or obj.get("success") is False)


def parse_error_message(body: Any) -> str:
    """One message string from any SGLang error body.

    Shapes: ``{"error": {"message": m}}`` (request validation), ``{"error": m}`` (unknown sampling field),
    ``{"object": "error", "message": m, ...}`` (body parse errors), ``{"success": false, "message": m}``
    (weight update), a plain-text body (``"Flush cache failed.\\n"``), or empty -> "".
    """
    if body is None:
        return ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        return body.strip()
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err)).strip()
        if err is not None:
            return str(err).strip()
        if "message" in body:
            return str(body["message"]).strip()
        if "detail" in body:  # plain FastAPI error
            return str(body["detail"]).strip()
    return str(body)


def error_body(message: str) -> dict:
    """Error body the embedded server sends for bad input: ``{"error": {"message": message}}``."""
    return {"error": {"message": message}}


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
