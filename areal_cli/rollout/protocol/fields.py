"""Type checks of decoded JSON values, shared by the parsers of the wire format.

``bool`` is not an int here (JSON ``true`` is no token id), and a field checker raises :class:`ProtocolError`
with the message a server answers.
"""

from __future__ import annotations

from typing import Any

from areal_cli.rollout.protocol.errors import ProtocolError


def is_int(x: Any) -> bool:
    """True for an int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """True for an int or a float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def int_field(body: dict, key: str, *, lo: int | None = None) -> int:
    """``body[key]`` as an int (a digit string too, as pydantic's lax mode), at least ``lo`` when given.

    Raises:
        ProtocolError: missing, not an int, or below ``lo``.
    """
    v = body.get(key)
    if isinstance(v, str) and v.strip().isdigit():  # pydantic's lax mode takes "29500" for an int
        v = int(v)
    if not is_int(v):
        raise ProtocolError(f"{key} must be an int, got {v!r}")
    if lo is not None and v < lo:
        raise ProtocolError(f"{key} must be >= {lo}, got {v}")
    return int(v)


def str_field(body: dict, key: str, default: str | None = None) -> str:
    """``body[key]`` (else ``default``) as a non-empty string.

    Raises:
        ProtocolError: missing with no default, not a string, or empty.
    """
    v = body.get(key, default)
    if not isinstance(v, str) or not v:
        raise ProtocolError(f"{key} must be a non-empty string, got {v!r}")
    return v


def bool_field(body: dict, key: str, default: bool) -> bool:
    """``body[key]`` as a bool; ``default`` when it is missing or null.

    Raises:
        ProtocolError: present and not a bool.
    """
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ProtocolError(f"{key} must be a bool, got {v!r}")
    return v
