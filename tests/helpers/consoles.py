"""A rich Console that writes into memory, for commands whose printed report the tests read."""

from __future__ import annotations

import io

from rich.console import Console


def quiet_console() -> Console:
    """A 200-column Console writing into a StringIO (nothing reaches the terminal)."""
    return Console(file=io.StringIO(), width=200)


def text_of(console: Console) -> str:
    """Everything ``console`` (from ``quiet_console``) has printed so far."""
    return console.file.getvalue()
