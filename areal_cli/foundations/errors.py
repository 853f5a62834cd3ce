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


def raised_at(exc: BaseException, skip: tuple[str, ...] = ()) -> str:
    """Where ``exc`` was raised, as ``" (raised at FILE:LINE in FUNCTION)"``: the deepest frame of its traceback that
    is neither in ``skip`` (file paths), the standard library nor an installed package (the user's own code), else
    the deepest frame not in ``skip``; ``""`` without a traceback. Used by the messages of a user's reward and
    workflow that raised (:mod:`areal_cli.reward.pool`, :mod:`areal_cli.rollout.controller`)."""
    import sysconfig
    import traceback

    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    frames = [f for f in frames if f.filename not in skip]
    if not frames:
        return ""
    libs = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    own = [f for f in frames if not any(f.filename.startswith(d) for d in libs) and "site-packages" not in f.filename]
    f = (own or frames)[-1]
    return f" (raised at {f.filename}:{f.lineno} in {f.name})"
