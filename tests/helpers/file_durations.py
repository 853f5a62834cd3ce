"""Measured seconds per test file, for ordering the main run longest first (``tests/file_durations.json``).

pytest-xdist's ``--dist=loadfile`` hands whole files to the workers in queue order; by default it queues the
files with the most tests first, which puts a file of a few long tests (the real checkpoint's, the wheel
install's) last, where it alone sets the run's end. ``tests/conftest.py`` orders files by the durations
recorded here instead (longest processing time first, the classic list-scheduling rule: its makespan is
within 4/3 of the optimum). Files not listed count as :data:`DEFAULT_S`.

Refresh the record after adding or slowing tests (the files a junit file holds replace their entries; the others
are kept, so a run of just the new files is enough)::

    .venv/bin/python -m pytest -q --junitxml=/tmp/junit.xml [tests/test_new.py ...]
    .venv/bin/python -m tests.helpers.file_durations /tmp/junit.xml
"""

from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / "file_durations.json"
#: Seconds assumed for a test file missing from the record (about the median file).
DEFAULT_S = 10.0


def load() -> dict[str, float]:
    """``{"tests/test_x.py": seconds}`` from :data:`RECORD`; ``{}`` when it is missing or unreadable (the order
    then falls back to xdist's)."""
    try:
        data = json.loads(RECORD.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.get("seconds", {}).items()} if isinstance(data, dict) else {}


def from_junit(path: str | Path) -> dict[str, float]:
    """Sum the test-case times of a pytest ``--junitxml`` file per test file (``classname`` ``tests.test_x``
    or ``tests.test_x.TestClass`` -> ``tests/test_x.py``), rounded to 0.1 s."""
    totals: collections.Counter[str] = collections.Counter()
    for case in ET.parse(path).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        while parts and not parts[-1].startswith("test_"):  # drop a test class name
            parts.pop()
        if parts:
            totals["/".join(parts) + ".py"] += float(case.get("time") or 0.0)
    return {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python -m tests.helpers.file_durations JUNIT.xml (from pytest --junitxml)", file=sys.stderr)
        return 2
    seconds = {**load(), **from_junit(argv[0])}
    seconds = dict(sorted(seconds.items(), key=lambda kv: -kv[1]))
    RECORD.write_text(json.dumps({"note": "seconds per test file, from tests/helpers/file_durations.py",
                                  "seconds": seconds}, indent=1) + "\n", encoding="utf-8")
    print(f"{RECORD}: {len(seconds)} files, {sum(seconds.values()) / 60:.1f} min in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
