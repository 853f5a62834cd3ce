"""JSON-lines files read as records with their line numbers: the one reader of evaluation benchmarks and
training records, so both report bad input the same way (``file:line: what``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

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
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            yield lineno, record
