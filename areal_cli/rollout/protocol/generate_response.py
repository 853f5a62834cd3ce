"""``/generate`` responses: the parsed result, the per-token policy versions, and the server's builder.

Response (a list for a batch; recorded from SGLang 0.5.23, ``shared/fixtures/sglang`` of the workspace):
``{text, output_ids, meta_info: {id, finish_reason, prompt_tokens, completion_tokens, output_token_logprobs:
[[logprob, token_id, text|null], ...], weight_version, weight_versions: [{version, start, end}], ...}}``.

- ``finish_reason``: ``{"type": "length", "length": n}``, ``{"type": "stop", "matched": int | str}``,
  ``{"type": "abort", "message": "Aborted", ...}`` (aborts come with HTTP 200 and partial output).
- ``weight_versions`` spans say which weights produced each output token; SGLang's initial label is
  ``"default"`` (version 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from areal_cli.rollout.protocol.errors import ProtocolError, ServerError, is_error_body, parse_error_message
from areal_cli.rollout.protocol.fields import is_int, is_number

ABORT_FINISH_REASON: dict[str, Any] = {"type": "abort", "message": "Aborted", "status_code": None,
                                       "err_type": None}


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
                if not isinstance(t, (list, tuple)) or len(t) < 2 or not is_number(t[0]) or not is_int(t[1]):
                    raise ProtocolError(f"bad output_token_logprobs entry {t!r} (want [logprob, id, text])")
                logprobs.append(float(t[0]))
                lp_ids.append(int(t[1]))
        if ids_raw is None:
            output_ids = lp_ids
        else:
            if not isinstance(ids_raw, list) or not all(is_int(t) for t in ids_raw):
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
                if not isinstance(s, dict) or not is_int(s.get("start")) or not is_int(s.get("end")):
                    raise ProtocolError(f"bad weight_versions entry {s!r}")
                spans.append((str(s.get("version")), int(s["start"]), int(s["end"])))
        itl_raw = meta.get("input_token_logprobs") or []
        itl: list[float | None] = []
        for t in itl_raw:
            if isinstance(t, (list, tuple)) and t and (t[0] is None or is_number(t[0])):
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
            e2e_latency=float(meta["e2e_latency"]) if is_number(meta.get("e2e_latency")) else None,
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
