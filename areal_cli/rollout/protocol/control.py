"""Control of generation: pause, continue, abort, and relabelling the loaded weights.

Bodies (SGLang 0.5.23, ``shared/fixtures/sglang`` of the workspace): ``/pause_generation {mode}``,
``/continue_generation {}``, ``/abort_request {rid} | {abort_all: true}``, ``/update_weight_version {new_version,
abort_all_requests}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_cli.rollout.protocol.errors import ProtocolError

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


def build_pause_payload(mode: str = "abort") -> dict:
    """``POST /pause_generation`` body. ``mode`` in {"abort", "retract", "in_place"}; SGLang's default is
    "abort" (in-flight requests return at once with finish_reason abort and their partial output)."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode must be abort, retract or in_place, got {mode!r}")
    return PauseGenerationRequest(mode).to_json()


def build_continue_payload() -> dict:
    """``POST /continue_generation`` body (empty object)."""
    return ContinueGenerationRequest().to_json()


def build_abort_payload(rid: str | None = None, abort_all: bool = False) -> dict:
    """``POST /abort_request`` body: ``{"rid": rid}`` or ``{"abort_all": true}``."""
    return AbortRequest(rid, abort_all).to_json()
