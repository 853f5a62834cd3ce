"""Codeforces rating and percentile estimate from per-problem verdicts (AReaL ``cf_elo_caculator.py``,
after CodeElo, Quan et al. 2025, arXiv:2501.01257, ``calc_rating.py``).

Method, per contest (see ``evaluation/codeforces/README.md`` for the data files):
1. Score: walk the contest's problems in standings order; for a problem we attempted, take the first
   success among the first ``pass_n`` attempts, at 0-based attempt index i. Problems with points
   (Codeforces-rules rounds): ``score += max(0, points - 50*i)`` (each earlier failure is a wrong
   submission costing 50 points; solved at minute 0, so no time decay). Problems without points
   (ICPC-rules rounds, e.g. Educational): ``score += 1`` and ``penalty += 10*i`` (10 penalty minutes
   per wrong submission, solved at minute 0). Unsolved, unattempted or unknown problems add nothing.
2. Rank: the 0-based position of the first standings row we beat strictly (row points < score, or
   equal points and row penalty > ours), i.e. the number of participants ranked ahead of us or tied
   with us; the number of participants if we beat nobody. Rows are the official standings filtered to
   handles that also appear in the contest's rating changes (rated participants).
3. Rating: Elo expected seed of a newcomer rated r among the contest's participants (old ratings r_j),
   ``seed(r) = 1 + sum_j 1 / (1 + 10^((r - r_j) / 400))`` (1 + expected number of participants who
   beat r), decreasing in r. Binary search over integers: ``lo, hi = 0, max_j r_j + 100``; while
   ``hi - lo > 1``: ``mid = (lo + hi) // 2``; ``seed(mid) < rank`` -> ``hi = mid`` else ``lo = mid``;
   the rating is ``lo`` = the largest integer r in [1, max_j r_j + 99] with seed(r) >= rank (0 if none).
   As in AReaL/CodeElo, the 1-based seed is compared with the 0-based rank of step 2, and ratings are
   capped at max_j r_j + 99 (reached by a rank of 0 or 1).

Overall: the rating is the mean of the per-contest ratings over rated contests (a float); the percentile
is ``100 * bisect_left(sorted_ratings, rating) / len(sorted_ratings)``: the share of historical user
ratings strictly below it. Contests absent from the cache, whose API status is not "OK", whose
standings and rating changes do not match one to one, or with at most 200 rated participants are
skipped, as in AReaL, and listed with the reason in :attr:`RatingEstimate.skipped`.

Differences from AReaL: malformed data files raise :class:`UserError` naming the file and field instead
of skipping the contest silently; the cache is decoded one contest at a time (AReaL's file is ~1.9 GB);
AReaL rounds percentiles to 0.1 when computing them, here only when printing (:meth:`RatingEstimate.summary`).

Modules (arrows point down; ``__init__`` exports the public names below):

- :mod:`~areal_cli.eval.codeforces.verdicts`: :func:`rating_from_verdicts` (the one-call entry),
  :func:`problem_id_from`;
- :mod:`~areal_cli.eval.codeforces.data`: :func:`load_contest_cache`, :func:`load_sorted_ratings`,
  :func:`load_problem_ids`, :func:`parse_contest_entry`;
- :mod:`~areal_cli.eval.codeforces.rating`: the method, steps 1-3 (:func:`contest_results`,
  :func:`contest_score`, :func:`rank_in_standings`, :func:`expected_seed`, :func:`rating_for_rank`,
  :func:`percentile`, :func:`rate_contest`, :func:`estimate_rating`);
- :mod:`~areal_cli.eval.codeforces.contests`: the data model (:class:`ContestProblem`, :class:`StandingsRow`,
  :class:`ContestStandings`, :class:`ContestResult`, :class:`ContestRating`, :class:`RatingEstimate`,
  :func:`split_problem_id`).
"""

from areal_cli.eval.codeforces.contests import (
    PROBLEM_ID_RE,
    ContestProblem,
    ContestRating,
    ContestResult,
    ContestStandings,
    RatingEstimate,
    StandingsRow,
    split_problem_id,
)
from areal_cli.eval.codeforces.data import (
    CONTEST_CACHE_FILE,
    SORTED_RATINGS_FILE,
    load_contest_cache,
    load_problem_ids,
    load_sorted_ratings,
    parse_contest_entry,
)
from areal_cli.eval.codeforces.rating import (
    MIN_PARTICIPANTS,
    RATING_HEADROOM,
    WRONG_SUBMISSION_PENALTY,
    WRONG_SUBMISSION_POINTS,
    contest_results,
    contest_score,
    estimate_rating,
    expected_seed,
    percentile,
    rank_in_standings,
    rate_contest,
    rating_for_rank,
)
from areal_cli.eval.codeforces.verdicts import AREAL_PASS_N, problem_id_from, rating_from_verdicts

__all__ = [
    "AREAL_PASS_N",
    "CONTEST_CACHE_FILE",
    "MIN_PARTICIPANTS",
    "PROBLEM_ID_RE",
    "RATING_HEADROOM",
    "SORTED_RATINGS_FILE",
    "WRONG_SUBMISSION_PENALTY",
    "WRONG_SUBMISSION_POINTS",
    "ContestProblem",
    "ContestRating",
    "ContestResult",
    "ContestStandings",
    "RatingEstimate",
    "StandingsRow",
    "contest_results",
    "contest_score",
    "estimate_rating",
    "expected_seed",
    "load_contest_cache",
    "load_problem_ids",
    "load_sorted_ratings",
    "parse_contest_entry",
    "percentile",
    "problem_id_from",
    "rank_in_standings",
    "rate_contest",
    "rating_for_rank",
    "rating_from_verdicts",
    "split_problem_id",
]
