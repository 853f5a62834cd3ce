"""The last lines of a child process's log file: what every "it died; last lines:" error message ends with."""

from __future__ import annotations

from pathlib import Path


def log_tail(path: str | Path | None, n: int = 20, *, missing: str = "(no log)",
             empty: str = "(log is empty)") -> str:
    """The last ``n`` lines of the log file at ``path``, joined by newlines.

    Args:
        path: the log file; None reads as a log that cannot be read.
        n: how many lines at most.
        missing: returned when there is no path or the file cannot be read.
        empty: returned when the file has no lines.
    """
    if path is None:
        return missing
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return missing
    return "\n".join(lines[-n:]) if lines else empty
