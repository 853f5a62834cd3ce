"""The one-call entry: a Codeforces benchmark run's per-problem verdicts and the data directory -> the
rating estimate as a JSON-able dict (problem ids from metadata, data files read, contests rated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from areal_cli.foundations.errors import UserError
from areal_cli.eval.codeforces.contests import split_problem_id
from areal_cli.eval.codeforces.data import CONTEST_CACHE_FILE, SORTED_RATINGS_FILE, load_contest_cache, load_sorted_ratings
from areal_cli.eval.codeforces.rating import MIN_PARTICIPANTS, contest_results, estimate_rating

AREAL_PASS_N = 8  # AReaL eval_and_aggregate.py: cf_pass_n = --num_sample_nodes (default 8)


def problem_id_from(problem_id: str, meta: Mapping[str, Any] | None) -> str:
    """Codeforces id of a benchmark problem: ``meta["contest_id"]`` + ``meta["index"]`` when both are
    set, else ``problem_id`` itself (``"2000A"``).

    Raises:
        ValueError: neither gives an id like ``"2000A"``.
    """
    meta = meta or {}
    cid, index = meta.get("contest_id"), meta.get("index")
    pid = f"{cid}{index}" if cid not in (None, "") and index not in (None, "") else str(problem_id)
    split_problem_id(pid)
    return pid


def rating_from_verdicts(
    verdicts: Mapping[str, Sequence[bool]],
    metas: Mapping[str, Mapping[str, Any]],
    data_dir: str | Path,
    *,
    pass_n: int | None = AREAL_PASS_N,
    min_participants: int = MIN_PARTICIPANTS,
) -> dict[str, Any]:
    """Rating of a Codeforces benchmark run, from per-problem verdicts (sample order).

    Args:
        verdicts: problem id -> verdict per sample.
        metas: problem id -> metadata; ``contest_id`` and ``index`` give the Codeforces id
            (:func:`problem_id_from`).
        data_dir: holds ``all_contest_data.json`` and ``sorted_rating.json``
            (``evaluation/codeforces/README.md``).
        pass_n: attempts that count per problem (AReaL: 8 = ``--num_sample_nodes``; None = all).
        min_participants: see :func:`estimate_rating`.

    Returns:
        :meth:`RatingEstimate.to_dict` plus ``summary`` ("1962 / 97.5%"), ``pass_n``, ``n_skipped``.

    Raises:
        UserError: a problem without a Codeforces id, missing or malformed data files, or no contest
            could be rated.
    """
    data_dir = Path(data_dir)
    ids: list[str] = []
    for pid in verdicts:
        try:
            ids.append(problem_id_from(pid, metas.get(pid)))
        except ValueError as e:
            raise UserError(f"codeforces: problem '{pid}': {e}") from None
    try:
        results = contest_results(ids, list(verdicts.values()), pass_n)
    except ValueError as e:
        raise UserError(f"codeforces: {e}") from None
    cache = load_contest_cache(data_dir / CONTEST_CACHE_FILE, contest_ids=[r.contest_id for r in results])
    est = estimate_rating(
        results, cache, load_sorted_ratings(data_dir / SORTED_RATINGS_FILE), min_participants=min_participants
    )
    return {**est.to_dict(), "summary": est.summary(), "pass_n": pass_n, "n_skipped": len(est.skipped)}
