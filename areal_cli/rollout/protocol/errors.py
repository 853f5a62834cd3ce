"""Errors of the wire format: a body that breaks the protocol, a server's HTTP error, and SGLang's error bodies.

Error bodies (recorded from SGLang 0.5.23, ``shared/fixtures/sglang`` of the workspace): ``{"error": {"message":
str}}``, ``{"error": str}``, ``{"object": "error", "message": str, ...}``, ``{"success": false, "message": str}``
(weight update) or a plain-text body (``/flush_cache``); :func:`parse_error_message` turns any of them into one
string.
"""

from __future__ import annotations

from typing import Any


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
