"""Atomic file writes: a file is either complete or untouched, never half-written."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic_many(files: dict[Path, str]) -> None:
    """Write several text files so that each is either complete or untouched: all contents go to temp
    files in the target directory first; only when all are written are they renamed into place."""
    tmps: list[tuple[Path, Path]] = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            tmps.append((Path(tmp), path))
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are ordinary readable files
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, path in tmps:
            os.replace(tmp, path)
    finally:
        for tmp, _ in tmps:
            if tmp.exists():
                tmp.unlink()


def write_json_atomic(path: Path, obj: Any) -> None:
    """``json.dumps(obj, indent=2)`` into ``path`` atomically."""
    write_atomic_many({Path(path): json.dumps(obj, indent=2) + "\n"})
