"""Progress of an ``areal eval`` run: a rich progress bar per (dataset, pass), or nothing."""

from __future__ import annotations

from typing import Any


class Progress:
    """A rich progress bar per (dataset, pass), or nothing (``enabled=False``)."""

    def __init__(self, console: Any, enabled: bool) -> None:
        self._bar = None
        self._tasks: dict[tuple[str, str], Any] = {}
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)

    def add(self, dataset: str, pass_name: str, total: int, completed: int, verb: str) -> None:
        if self._bar is not None and total:
            label = f"{dataset} ({verb})" if pass_name == "sample" else f"{dataset} greedy ({verb})"
            self._tasks[(dataset, pass_name)] = self._bar.add_task(label, total=total, completed=completed)

    def advance(self, dataset: str, pass_name: str) -> None:
        if self._bar is not None:
            self._bar.advance(self._tasks[(dataset, pass_name)])

    def __enter__(self) -> "Progress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
