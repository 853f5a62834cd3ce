"""The OpenAI Chat Completions wire format, as the embedded server and the per-episode agent proxy speak it.

Pure functions and dataclasses (no torch, no rollout imports): request parsing and validation, rendering the
messages with the tokenizer's own chat template, tool-call parsing, the response body and OpenAI-style errors.

Sources of the rules:

- Request and response schema: the OpenAI API reference, "Create chat completion" (``POST
  /v1/chat/completions``): ``messages``, ``tools`` (``{"type": "function", "function": {name, description,
  parameters}}``), ``temperature`` in [0, 2], ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop`` (a
  string or up to 4), ``n``, ``logprobs`` / ``top_logprobs``, ``seed``; the response ``{id: "chatcmpl-...",
  object: "chat.completion", created, model, choices: [{index, message: {role, content, tool_calls}, logprobs,
  finish_reason}], usage: {prompt_tokens, completion_tokens, total_tokens}}``; errors ``{"error": {message, type,
  param, code}}`` with HTTP 400 for an invalid request.
- Tool calls in the model's text: the Qwen / Hermes format, ``<tool_call>\\n{"name": ..., "arguments": {...}}
  \\n</tool_call>`` (Qwen2.5 / Qwen3 chat templates; SGLang's and vLLM's ``qwen25`` / ``hermes`` parsers; AReaL's
  ``ArealOpenAI(tool_call_parser="qwen")``).
- Rendering: ``tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)`` as text, then
  tokenised without added special tokens (how :mod:`areal_cli.tasks.prompts` renders a chat prompt).

Not supported (a 400 naming the parameter, never silently ignored): ``n > 1``, ``stream``, ``top_logprobs > 0``,
``tool_choice`` other than ``auto`` / ``none``, a ``stop`` string that is not one token of the vocabulary
(generation stops on token ids), non-text content parts, non-zero ``frequency_penalty`` / ``presence_penalty``.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
#: Accepted request keys; any other is a 400 (the OpenAI API rejects unknown arguments too).
KNOWN_KEYS = frozenset({
    "messages", "model", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "max_completion_tokens",
    "stop", "n", "logprobs", "top_logprobs", "seed", "stream", "stream_options", "user", "metadata", "store",
    "parallel_tool_calls", "frequency_penalty", "presence_penalty", "response_format", "service_tier",
    "top_k", "reasoning_effort",
})
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class OpenAIError(Exception):
    """A request the endpoint refuses, with the OpenAI error body (API reference, "Error codes").

    Attributes:
        status: HTTP status (400 invalid request, 404 unknown session, 500/502/503 server side).
        message: one line for a person.
        param: the request parameter at fault (``"messages[2].content"``), or None.
        type: ``"invalid_request_error"`` (4xx) or ``"server_error"``.
    """

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, type: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = int(status), message, param, code
        self.type = type or ("invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class ChatRequest:
    """A validated chat-completion request.

    Attributes:
        messages: list of ``{"role", "content": str, ...}`` ready for a chat template (content parts joined;
            assistant ``tool_calls`` arguments as dicts, as Hugging Face templates expect).
        tools: the ``tools`` list as sent, or None.
        temperature, top_p: sampling as sent, None when the request leaves them out (the embedded server's
            endpoint then uses OpenAI's defaults 1.0, 1.0; a training run's proxy uses the run's sampling).
        max_tokens: the generation budget asked for (``max_completion_tokens`` or ``max_tokens``), or None.
        stop: stop strings (each must be one token).
        logprobs: return per-token logprobs in ``choices[0].logprobs``.
        seed: sampling seed, or None.
        model: the ``model`` string (echoed back).
        top_k: (extension, as SGLang/vLLM accept it) -1 = off.
    """

    messages: list[dict]
    tools: list[dict] | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    seed: int | None = None
    model: str = "areal"
    top_k: int = -1


def _num(body: dict, key: str, lo: float, hi: float, default: float | None, *, lo_open: bool = False
         ) -> float | None:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v > hi or v < lo or (lo_open and v == lo):
        rng = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise OpenAIError(f"'{key}' must be a number in {rng}, got {v!r}", param=key)
    return float(v)


def _int(body: dict, key: str, lo: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise OpenAIError(f"'{key}' must be an integer >= {lo}, got {v!r}", param=key)
    return int(v)


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for j, p in enumerate(c):
            if not isinstance(p, dict) or p.get("type") not in ("text", "input_text", "output_text") \
                    or not isinstance(p.get("text"), str):
                raise OpenAIError(f"messages[{i}].content[{j}]: only text content parts are supported",
                                  param=f"messages[{i}].content")
            parts.append(p["text"])
        return "".join(parts)
    raise OpenAIError(f"messages[{i}].content must be a string, a list of text parts or null",
                      param=f"messages[{i}].content")


def _tool_calls(m: dict, i: int) -> list[dict] | None:
    calls = m.get("tool_calls")
    if calls is None:
        return None
    if not isinstance(calls, list):
        raise OpenAIError(f"messages[{i}].tool_calls must be a list", param=f"messages[{i}].tool_calls")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise OpenAIError(f"messages[{i}].tool_calls[{j}] needs function.name",
                              param=f"messages[{i}].tool_calls")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                pass  # kept as the string the model wrote
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_json_body(raw: bytes) -> Any:
    """The JSON value of a request body, or an :class:`OpenAIError` (400) for anything that is not valid JSON of
    valid Unicode text: malformed JSON or UTF-8, integers beyond Python's 4300-digit limit, nesting too deep to
    parse, and lone surrogates (``"\\ud800"``, which no tokenizer can encode)."""
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise OpenAIError(f"the request body is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None
    stack = [body]
    while stack:  # iterative: a deeply nested body cannot exhaust the recursion limit here
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise OpenAIError("the request holds a lone surrogate such as \\ud800: not valid Unicode text") from None
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return body


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body (module docstring: rules and their source).

    Returns:
        :class:`ChatRequest`.
    Raises:
        OpenAIError: status 400, naming the parameter.
    """
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    unknown = sorted(k for k in body if k not in KNOWN_KEYS)
    if unknown:
        raise OpenAIError(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise OpenAIError("'messages' must be a non-empty list", param="messages")
    messages = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise OpenAIError(f"messages[{i}] must be an object with a role in {', '.join(ROLES)}",
                              param=f"messages[{i}].role")
        out: dict[str, Any] = {"role": m["role"], "content": _content(m, i)}
        calls = _tool_calls(m, i) if m["role"] == "assistant" else None
        if calls:
            out["tool_calls"] = calls
        for k in ("name", "tool_call_id"):
            if isinstance(m.get(k), str):
                out[k] = m[k]
        messages.append(out)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
                isinstance(t, dict) and t.get("type", "function") == "function" and isinstance(t.get("function"), dict)
                and isinstance(t["function"].get("name"), str) for t in tools):
            raise OpenAIError("'tools' must be a list of {\"type\": \"function\", \"function\": {\"name\", ...}}",
                              param="tools")
        tools = tools or None
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise OpenAIError("only tool_choice 'auto' or 'none' is supported", param="tool_choice")
    if choice == "none":
        tools = None
    if body.get("stream"):
        raise OpenAIError("streaming is not supported: send stream=false", param="stream")
    if body.get("n") not in (None, 1):
        raise OpenAIError(f"only n=1 is supported, got {body.get('n')!r}", param="n")
    if body.get("top_logprobs") not in (None, 0):
        raise OpenAIError("top_logprobs is not supported", param="top_logprobs")
    for k in ("frequency_penalty", "presence_penalty"):
        if body.get(k) not in (None, 0, 0.0):
            raise OpenAIError(f"'{k}' is not supported (only 0)", param=k)
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        raise OpenAIError("only response_format {\"type\": \"text\"} is supported", param="response_format")
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise OpenAIError("'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise OpenAIError("'logprobs' must be a boolean", param="logprobs")
    top_k = _int(body, "top_k", -1)
    if top_k == 0:
        raise OpenAIError("'top_k' must be -1 (off) or >= 1", param="top_k")
    model = body.get("model")
    return ChatRequest(messages=messages, tools=tools, temperature=_num(body, "temperature", 0.0, 2.0, None),
                       top_p=_num(body, "top_p", 0.0, 1.0, None, lo_open=True), max_tokens=max_tokens, stop=stop,
                       logprobs=bool(logprobs), seed=_int(body, "seed", 0) if body.get("seed") is not None else None,
                       model=model if isinstance(model, str) and model else "areal",
                       top_k=-1 if top_k is None else top_k)


# ------------------------------------------------------------------------------------------ rendering
def render_prompt_ids(tokenizer: Any, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The prompt ids of a whole conversation: the tokenizer's chat template rendered as text with the generation
    prompt (and ``tools``, which Qwen templates put in the system prompt), tokenised without added special tokens.

    Raises:
        OpenAIError: no chat template, or the template failed on these messages (400).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise OpenAIError("the model's tokenizer has no chat template: /v1/chat/completions needs one "
                          "(use /generate with token ids)", status=400)
    kw = {"tools": tools} if tools else {}
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    except Exception as e:  # noqa: BLE001 - jinja errors of the model's template are the request's fault
        raise OpenAIError(f"the chat template failed on these messages: {type(e).__name__}: {e}",
                          param="messages") from None
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def stop_token_ids(tokenizer: Any, stop: list[str]) -> list[int]:
    """The token id of each stop string (generation stops on ids, so each must be ONE token of the vocabulary).

    Raises:
        OpenAIError: a stop string that is not a single token (400, ``param: stop``).
    """
    out = []
    for s in stop:
        ids = tokenizer(s, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise OpenAIError(f"stop string {s!r} is {len(ids)} tokens; only single-token stop strings are "
                              f"supported (generation stops on token ids)", param="stop")
        out.append(int(ids[0]))
    return out


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """Split a completion in the Qwen / Hermes format into its content and its tool calls.

    Each ``<tool_call>{"name": str, "arguments": object}</tool_call>`` block whose JSON parses becomes
    ``{"id": "call_<hex>", "type": "function", "function": {"name", "arguments": <JSON string>}}`` (OpenAI's
    ``tool_calls`` item: ``arguments`` is a JSON-encoded string) and is removed from the content; a block that
    does not parse stays in the content (the caller sees what the model wrote).

    Returns:
        ``(content or None when nothing else is left, tool_calls)``.
    """
    calls: list[dict] = []

    def take(m: re.Match) -> str:
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            return m.group(0)
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return m.group(0)
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
        return ""

    rest = _TOOL_CALL.sub(take, text).strip()
    return (rest or None), calls


def assistant_message(text: str, tools_given: bool, finish_reason: str) -> tuple[dict, str]:
    """The response ``message`` and ``finish_reason`` of a completion's decoded text.

    With tools in the request, tool calls are parsed (:func:`parse_tool_calls`) and a completion that stopped on
    its own with at least one call finishes with ``"tool_calls"`` (OpenAI's rule). Without tools the text is the
    content verbatim.
    """
    if not tools_given:
        return {"role": "assistant", "content": text}, finish_reason
    content, calls = parse_tool_calls(text)
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
        if finish_reason == "stop":
            finish_reason = "tool_calls"
    return msg, finish_reason


def logprobs_content(tokenizer: Any, ids: list[int], logprobs: list[float]) -> dict:
    """``choices[0].logprobs``: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": []}, ...]}``, one
    entry per generated token (the token text decoded alone, special tokens kept)."""
    out = []
    for t, lp in zip(ids, logprobs):
        s = tokenizer.decode([int(t)], skip_special_tokens=False)
        out.append({"token": s, "logprob": float(lp), "bytes": list(s.encode("utf-8")), "top_logprobs": []})
    return {"content": out}


def chat_completion_body(*, message: dict, finish_reason: str, prompt_tokens: int, completion_tokens: int,
                         model: str, response_id: str | None = None, logprobs: dict | None = None,
                         fingerprint: str | None = None) -> dict:
    """The ``chat.completion`` object (OpenAI API reference), one choice."""
    return {
        "id": response_id or f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": model, "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": int(prompt_tokens), "completion_tokens": int(completion_tokens),
                  "total_tokens": int(prompt_tokens) + int(completion_tokens)},
    }


def message_key(m: dict) -> tuple:
    """A comparable form of a (normalised) message: role, content, tool calls as ``(name, arguments)`` with the
    arguments canonical JSON. Two requests share a prefix when their keys agree (ids of tool calls, names and other
    metadata are ignored)."""
    calls = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function", {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append((fn.get("name"), json.dumps(args, sort_keys=True, ensure_ascii=False)))
    return (m.get("role"), m.get("content") or "", tuple(calls))
