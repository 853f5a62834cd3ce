"""JSON-lines files read as records with their line numbers: the one reader of evaluation benchmarks and
training records, so both report bad input the same way (``file:line: what``); and appended to, whole lines at a
time, without leaving a half line behind (:func:`append_json_lines`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from areal_cli.foundations.errors import UserError


def iter_json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, record)`` for each non-blank line of a JSON-lines file, streamed.

    Raises:
        UserError: missing or unreadable file, not UTF-8, a malformed line or a line that is not a JSON object.
    """
    try:
        handle = path.open(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        lineno = 0
        while True:
            lineno += 1
            try:
                line = handle.readline()
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{lineno}: not UTF-8 text: {exc}") from None
            if not line:
                return
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{lineno}: malformed JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__} (JSON Lines: one "
                              f"object per line)")
            yield lineno, record


def append_json_lines(path: Path, rows: Iterable[dict]) -> int:
    """Append ``rows`` to the JSON-lines file ``path`` (created if missing), one object per line (UTF-8, non-ASCII
    text kept), all of them in one ``write`` of whole lines to a file opened for appending: nothing is written
    until every line is complete, so a reader sees each line with its end. A process killed inside that very write
    can leave a torn last line; the next append cuts the file back to its last full line first
    (:func:`cut_torn_tail`). Returns the number of lines appended."""
    lines = [json.dumps(row, ensure_ascii=False) + "\n" for row in rows]
    if not lines:
        return 0
    data = memoryview("".join(lines).encode("utf-8"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        _cut_torn_tail_fd(fd)
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    return len(lines)


def cut_torn_tail(path: Path) -> int:
    """Cut a JSON-lines file back to its last complete line (ending in a newline): what a writer killed
    mid-line leaves is dropped. A missing file is left alone. Returns the number of bytes cut."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    try:
        return _cut_torn_tail_fd(fd)
    finally:
        os.close(fd)


def _cut_torn_tail_fd(fd: int, chunk: int = 1 << 16) -> int:
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    end = size
    while end > 0:
        start = max(0, end - chunk)
        at = os.pread(fd, end - start, start).rfind(b"\n")
        if at >= 0:
            keep = start + at + 1
            break
        end = start
    else:
        keep = 0
    os.ftruncate(fd, keep)
    return size - keep


def lines_up_to_step(lines: Iterable[str], step: int) -> list[tuple[str, dict]]:
    """``(line, parsed row)`` of the JSON ``lines`` (a run's metrics.jsonl or samples.jsonl) whose integer ``step``
    is <= ``step``, in order; lines that do not parse (a torn last line) or carry no int step are skipped. What a run
    resumed from step ``step``'s checkpoint keeps of its logs."""
    out = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            out.append((line, row))
    return out
