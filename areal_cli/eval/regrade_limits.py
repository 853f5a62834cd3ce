"""What a regraded run recorded beside its ``samples.jsonl`` (``results.json``): its ``--limit`` (a run with
``--limit N`` covers the first N problems of each benchmark, and its ``samples.jsonl`` is regraded over those problems
only: :func:`recorded_limits` reads the limit, :func:`apply_limits` keeps those problems and refuses a completion
beyond them, never dropping one) and the task files of one's own tasks (:func:`recorded_task_file`, for messages).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from areal_cli.eval.benchmarks import Problem
from areal_cli.foundations.errors import UserError, where


def recorded_limits(generations: Path) -> dict[str, int]:
    """The ``--limit`` of the run that wrote ``generations``, per benchmark: ``config.data.<benchmark>.limit`` of
    the ``results.json`` in the same folder (what ``areal eval`` and a regrade write). Empty when there is no such
    file, it is not a results file of the kit, or the run had no limit.

    Raises:
        UserError: the results.json is not valid JSON, or records a limit that is not an integer >= 1.
    """
    results = generations.parent / "results.json"
    if not results.is_file():
        return {}
    try:
        cfg = json.loads(results.read_text(encoding="utf-8")).get("config")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise UserError(f"{results}: not a results file of areal eval ({exc}); move the generations file "
                        f"elsewhere to regrade it without it") from None
    data = cfg.get("data") if isinstance(cfg, dict) else None
    out: dict[str, int] = {}
    for ds, rep in (data or {}).items():
        limit = rep.get("limit") if isinstance(rep, dict) else None
        if limit is None:
            continue
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UserError(f"{results}: field 'config.data.{ds}.limit': must be an integer >= 1, got {limit!r}")
        out[ds] = limit
    return out


def apply_limits(path: Path, saved: list[Any], problems_by_ds: dict[str, list[Problem]],
                 reports: dict[str, dict[str, Any]], limits: dict[str, int], origin: dict[str, str]) -> None:
    """Keep the first ``limits[ds]`` problems of each benchmark (in place, recorded in its report as ``limit``).

    Args:
        origin: per benchmark, where its limit comes from (for messages: ``--limit`` or the results file).

    Raises:
        UserError: ``FILE:LINE: problem_id 'x' is problem k of benchmark 'b', beyond its limit N (...)``: a
            completion of a problem the limit leaves out (never dropped silently).
    """
    for ds, limit in limits.items():
        if ds not in problems_by_ds:
            continue
        position = {p.id: i for i, p in enumerate(problems_by_ds[ds], start=1)}
        for s in saved:
            if s.dataset == ds and position.get(s.problem_id, 0) > limit:
                raise UserError(f"{where(path, s.line)}: problem_id '{s.problem_id}' is problem "
                                f"{position[s.problem_id]} of benchmark '{ds}', beyond its limit {limit} "
                                f"({origin[ds]}): give a limit that covers it")
        problems_by_ds[ds] = problems_by_ds[ds][:limit]
        reports[ds] = {**reports[ds], "limit": limit}


def recorded_task_file(generations: Path, name: str) -> str | None:
    """The task file the run that wrote ``generations`` read for ``name`` (``config.data.<name>.task_file``, or
    the records file of a task without one, in the ``results.json`` beside it), or None."""
    try:
        data = json.loads((Path(generations).parent / "results.json").read_text(encoding="utf-8"))["config"]["data"]
        rep = data[name]
        return rep.get("task_file") or (rep["files"][-1]["path"] if rep.get("loader") == "task" else None)
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
