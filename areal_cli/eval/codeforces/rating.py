"""The rating method, per contest and overall: score under the contest's rules, rank in the rated
standings, the Elo rating whose expected seed matches that rank, the percentile among historical
ratings (package docstring, steps 1-3; AReaL ``cf_elo_caculator.py``, CodeElo ``calc_rating.py``)."""

from __future__ import annotations

import bisect
from typing import Iterable, Mapping, Sequence

from areal_cli.foundations.errors import UserError
from areal_cli.eval.codeforces.contests import (
    ContestProblem,
    ContestRating,
    ContestResult,
    ContestStandings,
    RatingEstimate,
    StandingsRow,
    split_problem_id,
)

MIN_PARTICIPANTS = 201  # AReaL/CodeElo: a contest needs more than 200 rated participants
WRONG_SUBMISSION_POINTS = 50  # Codeforces rules: -50 points per rejected submission of a solved problem
WRONG_SUBMISSION_PENALTY = 10  # ICPC rules on Codeforces: +10 penalty minutes per rejected submission
RATING_HEADROOM = 100  # binary-search upper bound: max old rating + 100


def contest_results(
    problem_ids: Sequence[str], attempts: Sequence[Sequence[bool]], pass_n: int | None = None
) -> list[ContestResult]:
    """Group per-problem verdict lists (sample order) by contest, in order of first appearance.

    Raises:
        ValueError: lengths differ, a malformed or repeated problem id, bad ``pass_n``.
    """
    if len(problem_ids) != len(attempts):
        raise ValueError(f"{len(problem_ids)} problem ids but {len(attempts)} verdict lists")
    grouped: dict[int, dict[str, Sequence[bool]]] = {}
    for pid, verdicts in zip(problem_ids, attempts):
        cid, index = split_problem_id(pid)
        if index in grouped.setdefault(cid, {}):
            raise ValueError(f"problem id {pid!r} appears twice")
        grouped[cid][index] = verdicts
    return [ContestResult.from_attempts(cid, probs, pass_n) for cid, probs in grouped.items()]


def contest_score(result: ContestResult, problems: Sequence[ContestProblem]) -> tuple[float, int]:
    """``(score, penalty)`` of our attempts under the contest's rules (package docstring, step 1)."""
    score: float = 0
    penalty = 0
    for prob in problems:
        i = result.first_success.get(prob.index)
        if i is None:
            continue
        if prob.points is not None:
            score += max(0, prob.points - WRONG_SUBMISSION_POINTS * i)
        else:
            score += 1
            penalty += WRONG_SUBMISSION_PENALTY * i
    return score, penalty


def rank_in_standings(rows: Sequence[StandingsRow], score: float, penalty: int) -> int:
    """0-based position of the first row we beat strictly (``len(rows)`` if none): the number of
    participants ahead of us or tied with us, rows being in standings order (package docstring, step 2)."""
    for i, row in enumerate(rows):
        if row.points < score or (row.points == score and row.penalty > penalty):
            return i
    return len(rows)


def expected_seed(rating: float, old_ratings: Iterable[float]) -> float:
    """Elo expected seed ``1 + sum_j 1 / (1 + 10^((rating - r_j) / 400))`` of a newcomer rated ``rating``."""
    return 1 + sum(1 / (1 + 10 ** ((rating - r) / 400)) for r in old_ratings)


def rating_for_rank(rank: float, old_ratings: Sequence[int]) -> int:
    """Integer binary search for the rating whose expected seed matches ``rank`` (step 3): the largest r
    in ``[1, max(old_ratings) + 99]`` with ``expected_seed(r) >= rank``, or 0 if there is none.

    Raises:
        ValueError: no participants.
    """
    if len(old_ratings) == 0:
        raise ValueError("rating_for_rank needs at least one participant")
    lo, hi = 0, int(max(old_ratings)) + RATING_HEADROOM
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if expected_seed(mid, old_ratings) < rank:
            hi = mid
        else:
            lo = mid
    return lo


def percentile(rating: float, sorted_ratings: Sequence[float]) -> float:
    """Share (%) of historical ratings strictly below ``rating``: ``100 * bisect_left / len``.

    ``sorted_ratings`` must be ascending (as :func:`load_sorted_ratings` returns it).

    Raises:
        ValueError: empty ``sorted_ratings``.
    """
    if len(sorted_ratings) == 0:
        raise ValueError("percentile needs a non-empty list of historical ratings")
    return 100 * bisect.bisect_left(sorted_ratings, float(rating)) / len(sorted_ratings)


def rate_contest(result: ContestResult, standings: ContestStandings, sorted_ratings: Sequence[float]) -> ContestRating:
    """Steps 1-3 for one contest, whatever its number of participants.

    Raises:
        ValueError: contest ids differ, or the standings have no rows.
    """
    if result.contest_id != standings.contest_id:
        raise ValueError(f"result is for contest {result.contest_id}, standings for {standings.contest_id}")
    score, penalty = contest_score(result, standings.problems)
    rank = rank_in_standings(standings.rows, score, penalty)
    rating = rating_for_rank(rank, standings.old_ratings)
    return ContestRating(
        contest_id=standings.contest_id,
        score=score,
        penalty=penalty,
        rank=rank,
        n_participants=len(standings.rows),
        rating=rating,
        percentile=percentile(rating, sorted_ratings),
    )


def estimate_rating(
    results: Sequence[ContestResult],
    contests: Mapping[int, ContestStandings | str],
    sorted_ratings: Sequence[float],
    *,
    min_participants: int = MIN_PARTICIPANTS,
) -> RatingEstimate:
    """Codeforces rating and percentile over several contests (package docstring).

    Args:
        results: our attempts, one per contest (:func:`contest_results`).
        contests: contest id -> standings, or a reason string for a contest present in the data but
            unusable (as :func:`load_contest_cache` returns).
        sorted_ratings: historical ratings, ascending (:func:`load_sorted_ratings`).
        min_participants: skip contests with fewer rated participants (AReaL: more than 200).

    Raises:
        UserError: no contest could be rated (the message lists why, per contest).
    """
    rated: list[ContestRating] = []
    skipped: dict[int, str] = {}
    for res in results:
        st = contests.get(res.contest_id)
        if st is None:
            skipped[res.contest_id] = "not in the contest data"
        elif isinstance(st, str):
            skipped[res.contest_id] = st
        elif len(st.rows) < min_participants:
            skipped[res.contest_id] = f"{len(st.rows)} rated participants, fewer than {min_participants}"
        else:
            rated.append(rate_contest(res, st, sorted_ratings))
    if not rated:
        reasons = "; ".join(f"{cid}: {why}" for cid, why in list(skipped.items())[:5])
        more = f" (and {len(skipped) - 5} more)" if len(skipped) > 5 else ""
        raise UserError(f"codeforces: none of {len(results)} contests could be rated: {reasons}{more}")
    mean = sum(c.rating for c in rated) / len(rated)
    return RatingEstimate(
        rating=mean, percentile=percentile(mean, sorted_ratings), contests=tuple(rated), skipped=skipped
    )
