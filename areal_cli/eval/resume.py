"""Resuming an interrupted ``areal eval``: finished samples are kept in ``OUT/samples.partial.jsonl``.

Layout of the partial file (JSON Lines, appended and flushed one line per finished sample):

- line 1, the header: ``{"areal_eval_partial": 1, "config_hash": "<sha256 hex>", "config": {...}}`` where
  ``config`` is everything that decides what a sample is (datasets and their prompt ids + gold answers,
  protocol and sampling settings, model, seed; :func:`config_hash`);
- then one graded sample record per line (the records that end up in ``samples.jsonl``).

On restart with the same ``--out``: same hash -> the finished (pass, dataset, problem_id, sample_index) are
skipped; different hash -> :class:`UserError` naming the settings that differ. A last line without its
newline was torn by a kill mid-write: it is dropped (and cut from the file), not an error. A malformed
line elsewhere is an error with ``file:line``. The partial file is deleted after ``results.json``,
``report.md`` and ``samples.jsonl`` were written (atomically).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, IO

from areal_cli.foundations.errors import UserError, where

PARTIAL_NAME = "samples.partial.jsonl"
HEADER_KEY = "areal_eval_partial"
FORMAT_VERSION = 1


def canonical_json(obj: Any) -> str:
    """Sorted-keys, compact JSON (the input of :func:`config_hash`)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def config_hash(config: dict[str, Any]) -> str:
    """SHA-256 hex of :func:`canonical_json` of the effective configuration."""
    return hashlib.sha256(canonical_json(config).encode("utf-8")).hexdigest()


def sample_key(record: dict[str, Any]) -> tuple[str, str, str, int]:
    """(pass, dataset, problem_id, sample_index) of a sample record."""
    return (str(record.get("pass", "sample")), str(record["dataset"]), str(record["problem_id"]),
            int(record["sample_index"]))


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Top-level-first names of the fields that differ between two configs (for the error message)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            name = f"{prefix}{k}"
            if k not in old or k not in new:
                out.append(name)
            elif old[k] != new[k]:
                out.extend(_differences(old[k], new[k], name + ".") if isinstance(old[k], dict) else [name])
        return out
    return [prefix.rstrip(".") or "config"] if old != new else []


class PartialRun:
    """The append-only file of finished samples of one run (see module docstring).

    Use :meth:`open`; then :meth:`append` each finished sample; :meth:`close`; :meth:`remove` after the
    final files were written.

    Attributes:
        path: the partial file. records: the finished samples read back at open (graded records).
    """

    def __init__(self, path: Path, records: list[dict[str, Any]], fh: IO[str]) -> None:
        self.path = path
        self.records = records
        self._fh = fh

    @classmethod
    def open(cls, out_dir: Path, config: dict[str, Any], valid_keys: set[tuple[str, str, str, int]]) -> "PartialRun":
        """Open (resume) or create ``out_dir/samples.partial.jsonl`` for ``config``.

        Args:
            valid_keys: the keys of every sample of this run; a saved record with another key is an error.

        Raises:
            UserError: the file was written by a different configuration (names the differing fields),
                has no valid header, a malformed / duplicate / foreign record (``file:line``).
        """
        path = out_dir / PARTIAL_NAME
        digest = config_hash(config)
        records: list[dict[str, Any]] = []
        if path.exists():
            records = _read_existing(path, config, digest, valid_keys)
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
            header = {HEADER_KEY: FORMAT_VERSION, "config_hash": digest, "config": config}
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(header, ensure_ascii=False) + "\n")
        return cls(path, records, open(path, "a", encoding="utf-8"))

    def append(self, record: dict[str, Any]) -> None:
        """Write one finished sample as one line and flush it (survives a kill of this process)."""
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    def remove(self) -> None:
        """Close and delete the partial file (call after the final outputs were written)."""
        self.close()
        self.path.unlink(missing_ok=True)


def _read_existing(path: Path, config: dict[str, Any], digest: str,
                   valid_keys: set[tuple[str, str, str, int]]) -> list[dict[str, Any]]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None
    torn = not data.endswith(b"\n")
    if torn:
        cut = data.rfind(b"\n") + 1  # drop the torn last line (killed mid-write)
        data = data[:cut]
        with open(path, "r+b") as fh:
            fh.truncate(cut)
    try:
        lines = data.decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text: {exc}") from None
    if not lines:
        # nothing survived (killed while writing the header): start afresh
        header = {HEADER_KEY: FORMAT_VERSION, "config_hash": digest, "config": config}
        path.write_text(json.dumps(header, ensure_ascii=False) + "\n", encoding="utf-8")
        return []
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise UserError(f"{where(path, 1)}: malformed JSON in the resume header: {exc.msg}") from None
    if not isinstance(header, dict) or header.get(HEADER_KEY) != FORMAT_VERSION or "config_hash" not in header:
        raise UserError(f"{where(path, 1)}: not an areal eval resume header; use another --out")
    if header["config_hash"] != digest:
        changed = _differences(header.get("config"), config)
        raise UserError(
            f"{path}: an interrupted run with a different configuration (config hash "
            f"{str(header['config_hash'])[:12]} vs {digest[:12]}; differs in: {', '.join(changed) or 'unknown'}); "
            "rerun with the same settings to resume, or choose another --out"
        )
    records: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, str, int], int] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            key = sample_key(rec)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where(path, lineno)}: malformed JSON: {exc.msg} (column {exc.colno})") from None
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UserError(f"{where(path, lineno)}: not a sample record (needs dataset, problem_id, "
                            "sample_index)") from None
        if key not in valid_keys:
            raise UserError(f"{where(path, lineno)}: sample {key} is not part of this run")
        if key in seen:
            raise UserError(f"{where(path, lineno)}: sample {key} saved twice (first on line {seen[key]})")
        seen[key] = lineno
        records.append(rec)
    return records
