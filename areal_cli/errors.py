"""User-facing errors: bad input is reported as one line and exit code 2, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (file, record, option).

    The message is one line saying where and what, e.g. ``data/aime24.jsonl:7: field 'answer' missing``.
    The CLI prints ``error: <message>`` to stderr and exits with code 2.
    """

    exit_code = 2


def where(path: object, line: int | None = None, field: str | None = None) -> str:
    """Format a location prefix ``path[:line][: field 'x']`` for a :class:`UserError` message."""
    loc = str(path)
    if line is not None:
        loc += f":{line}"
    if field is not None:
        loc += f": field '{field}'"
    return loc
