"""User-facing errors: bad input is reported as one line and exit code 2, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (file, record, option).

    The message is one line saying where and what, e.g. ``data/aime24.jsonl:7: field 'answer' missing``.
    The CLI prints ``error: <message>`` to stderr and exits with code 2.
    """

    exit_code = 2


class RunFailure(RuntimeError):
    """A run failed for a reason that is not bad input (a trainer rank died, ...). The CLI prints
    ``error: <headline>`` (one line; the details, such as log tails, stay in ``str(e)`` and the logs) and exits
    with code 1.

    Attributes:
        headline: the one-line summary (default: the first line of the message).
    """

    exit_code = 1

    def __init__(self, message: str, headline: str | None = None):
        super().__init__(message)
        self.headline = headline or (message.splitlines()[0] if message else type(self).__name__)


def where(path: object, line: int | None = None, field: str | None = None) -> str:
    """Format a location prefix ``path[:line][: field 'x']`` for a :class:`UserError` message."""
    loc = str(path)
    if line is not None:
        loc += f":{line}"
    if field is not None:
        loc += f": field '{field}'"
    return loc
