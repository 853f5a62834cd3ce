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
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from areal_cli.errors import UserError, where

# AReaL ``format_grouped_contest_data``: ``re.match(r'(\d+)([A-Z].*)', problem_id)``.
PROBLEM_ID_RE = re.compile(r"(\d+)([A-Z].*)")
MIN_PARTICIPANTS = 201  # AReaL/CodeElo: a contest needs more than 200 rated participants
WRONG_SUBMISSION_POINTS = 50  # Codeforces rules: -50 points per rejected submission of a solved problem
WRONG_SUBMISSION_PENALTY = 10  # ICPC rules on Codeforces: +10 penalty minutes per rejected submission
RATING_HEADROOM = 100  # binary-search upper bound: max old rating + 100
AREAL_PASS_N = 8  # AReaL eval_and_aggregate.py: cf_pass_n = --num_sample_nodes (default 8)
CONTEST_CACHE_FILE = "all_contest_data.json"
SORTED_RATINGS_FILE = "sorted_rating.json"


# ----------------------------------------------------------------------------------------- data model
@dataclass(frozen=True)
class ContestProblem:
    """One problem of a contest. ``points`` is None for ICPC-rules contests (no points field)."""

    contest_id: int
    index: str
    points: float | None = None

    @property
    def problem_id(self) -> str:
        """AReaL/CodeElo id, contest id + index: ``2000A``."""
        return f"{self.contest_id}{self.index}"


@dataclass(frozen=True)
class StandingsRow:
    """One rated participant: ``points`` (Codeforces rules: points incl. hacks; ICPC rules: problems
    solved), ``penalty`` (minutes; 0 under Codeforces rules), ``old_rating`` (rating before the contest)."""

    handle: str
    points: float
    penalty: int
    old_rating: int


@dataclass(frozen=True)
class ContestStandings:
    """A contest's final standings restricted to rated participants, in standings order (best first)."""

    contest_id: int
    problems: tuple[ContestProblem, ...]
    rows: tuple[StandingsRow, ...]
    name: str = ""

    @property
    def old_ratings(self) -> list[int]:
        return [r.old_rating for r in self.rows]


@dataclass(frozen=True)
class ContestResult:
    """Our attempts at one contest: ``first_success[index]`` is the 0-based attempt index of the first
    success among the attempts that count, None when none of them succeeded."""

    contest_id: int
    first_success: Mapping[str, int | None]

    @classmethod
    def from_attempts(
        cls, contest_id: int, attempts: Mapping[str, Sequence[bool]], pass_n: int | None = None
    ) -> ContestResult:
        """Keep only the first ``pass_n`` attempts of each problem (None = all, AReaL's default when
        ``pass_n`` is not given). AReaL's driver passes ``pass_n = num_sample_nodes`` (8).

        Raises:
            ValueError: ``pass_n`` < 1.
        """
        if pass_n is not None and (isinstance(pass_n, bool) or not isinstance(pass_n, int) or pass_n < 1):
            raise ValueError(f"pass_n must be a positive integer or None, got {pass_n!r}")
        first: dict[str, int | None] = {}
        for index, verdicts in attempts.items():
            counted = list(verdicts)[:pass_n]
            first[str(index)] = next((i for i, ok in enumerate(counted) if ok), None)
        return cls(contest_id=int(contest_id), first_success=first)


@dataclass(frozen=True)
class ContestRating:
    """The estimate for one contest (fields as in the module docstring's steps)."""

    contest_id: int
    score: float
    penalty: int
    rank: int
    n_participants: int
    rating: int
    percentile: float


@dataclass(frozen=True)
class RatingEstimate:
    """Mean rating over rated contests, its percentile, per-contest detail, skipped contests with reason."""

    rating: float
    percentile: float
    contests: tuple[ContestRating, ...]
    skipped: dict[int, str] = field(default_factory=dict)

    def summary(self) -> str:
        """``"2044 / 98.2%"``: AReaL's "rating / percentile" column (rating .0f, percentile .1f)."""
        return f"{self.rating:.0f} / {self.percentile:.1f}%"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for results files."""
        return {
            "rating": self.rating,
            "percentile": self.percentile,
            "n_contests": len(self.contests),
            "contests": [vars(c) for c in self.contests],
            "skipped": {str(k): v for k, v in self.skipped.items()},
        }


# ---------------------------------------------------------------------------------------- the method
def split_problem_id(problem_id: str) -> tuple[int, str]:
    """``"2000A"`` -> ``(2000, "A")``; ``"1910B1"`` -> ``(1910, "B1")`` (AReaL's regex).

    Raises:
        ValueError: not digits followed by an upper-case letter.
    """
    m = PROBLEM_ID_RE.fullmatch(str(problem_id))
    if m is None:
        raise ValueError(f"invalid Codeforces problem id {problem_id!r} (expected e.g. '2000A')")
    return int(m.group(1)), m.group(2)


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
    """``(score, penalty)`` of our attempts under the contest's rules (module docstring, step 1)."""
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
    participants ahead of us or tied with us, rows being in standings order (module docstring, step 2)."""
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
    """Codeforces rating and percentile over several contests (module docstring).

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


# ------------------------------------------------------------------------------------------ loading
def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {e}") from None


def _load_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


def load_sorted_ratings(path: str | Path) -> list[float]:
    """Historical Codeforces ratings, ascending, from ``sorted_rating.json``.

    Accepted forms: AReaL's ``{"<rating>": <number of users>, ...}`` (``read_ratings`` expands it) or
    CodeElo's ``[<rating>, ...]``.

    Raises:
        UserError: unreadable file, another JSON type, a non-numeric rating, a negative or
            non-integer count, or no ratings at all.
    """
    path = Path(path)
    data = _load_json(path)
    out: list[float] = []
    if isinstance(data, dict):
        for key, count in data.items():
            try:
                rating = float(key)
            except ValueError:
                raise UserError(f"{where(path, field=key)}: rating key is not a number") from None
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise UserError(f"{where(path, field=key)}: count must be a non-negative integer, got {count!r}")
            out.extend([rating] * count)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise UserError(f"{where(path, field=f'[{i}]')}: rating must be a number, got {v!r}")
            out.append(float(v))
    else:
        raise UserError(f"{path}: expected an object {{rating: count}} or a list of ratings, got {type(data).__name__}")
    if not out:
        raise UserError(f"{path}: no ratings")
    return sorted(out)


def load_problem_ids(path: str | Path) -> list[str]:
    """``metadata_cf.json``: a JSON list of problem ids (``"2000A"``), entry i belonging to the benchmark
    problem with the i-th smallest ``idx`` (AReaL sorts samples by ``idx`` and zips them with this list).

    Raises:
        UserError: not a list, or an entry that is not a Codeforces problem id.
    """
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a list of problem ids like \"2000A\", got {type(data).__name__}")
    for i, pid in enumerate(data):
        if not isinstance(pid, str) or PROBLEM_ID_RE.fullmatch(pid) is None:
            raise UserError(f"{where(path, field=f'[{i}]')}: not a Codeforces problem id like \"2000A\": {pid!r}")
    return data


_WS = re.compile(r"[ \t\n\r]*")


def _iter_object_items(text: str, path: Path) -> Iterator[tuple[str, Any]]:
    """Decode a top-level JSON object one value at a time (peak memory: one value, not the whole file)."""
    dec = json.JSONDecoder()

    def fail(pos: int, msg: str) -> UserError:
        line = text.count("\n", 0, pos) + 1
        return UserError(f"{path}:{line}: invalid JSON: {msg}")

    i = _WS.match(text, 0).end()
    if text[i : i + 1] != "{":
        raise UserError(f"{path}: expected a JSON object {{\"<contest id>\": {{...}}, ...}} at the top level")
    i = _WS.match(text, i + 1).end()
    if text[i : i + 1] == "}":
        return
    while True:
        try:
            key, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise fail(e.pos, e.msg) from None
        if not isinstance(key, str):
            raise fail(i, "expected a string key")
        i = _WS.match(text, i).end()
        if text[i : i + 1] != ":":
            raise fail(i, "expected ':'")
        i = _WS.match(text, i + 1).end()
        try:
            value, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise fail(e.pos, e.msg) from None
        yield key, value
        i = _WS.match(text, i).end()
        c = text[i : i + 1]
        if c == "}":
            return
        if c != ",":
            raise fail(i, "expected ',' or '}'")
        i = _WS.match(text, i + 1).end()


class _Fields:
    """Typed access into one contest entry; errors name the file and the dotted field path."""

    def __init__(self, path: Path, prefix: str) -> None:
        self.path, self.prefix = path, prefix

    def error(self, fld: str, what: str) -> UserError:
        return UserError(f"{where(self.path, field=f'{self.prefix}.{fld}')}: {what}")

    def get(self, obj: Any, key: str, fld: str, types: type | tuple[type, ...]) -> Any:
        if not isinstance(obj, dict):
            raise self.error(fld.rsplit(".", 1)[0], "expected an object")
        if key not in obj:
            raise self.error(fld, "missing")
        v = obj[key]
        if isinstance(v, bool) or not isinstance(v, types):
            names = "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
            raise self.error(fld, f"expected {names}, got {v!r}"[:200])
        return v


def parse_contest_entry(contest_key: str, entry: Any, path: Path) -> ContestStandings | str:
    """One value of ``all_contest_data.json`` -> :class:`ContestStandings`, or the reason the contest is
    unusable (API status not "OK"; standings and rating changes not one to one after keeping the
    handles both list, as AReaL does).

    ``entry`` is ``{"standings": <contest.standings API response>, "rating_changes":
    <contest.ratingChanges API response>}``; fields read: ``standings.status``,
    ``standings.result.problems[].{contestId, index, points?}``,
    ``standings.result.rows[].{party.members[0].handle, points, penalty}``,
    ``standings.result.contest.name`` (optional), ``rating_changes.status``,
    ``rating_changes.result[].{handle, oldRating}``.

    Raises:
        UserError: a malformed key or a missing or mistyped field (file and field named).
    """
    if not contest_key.isdigit():
        raise UserError(f"{where(path, field=contest_key)}: contest id key is not a number")
    cid = int(contest_key)
    f = _Fields(path, contest_key)
    if not isinstance(entry, dict):
        raise UserError(f"{where(path, field=contest_key)}: expected an object with standings and rating_changes")
    standings = f.get(entry, "standings", "standings", dict)
    changes = f.get(entry, "rating_changes", "rating_changes", dict)
    for name, resp in (("standings", standings), ("rating_changes", changes)):
        status = resp.get("status")
        if status != "OK":
            comment = resp.get("comment")
            return f"{name} status {status!r}" + (f" ({comment})" if comment else "")
    result = f.get(standings, "result", "standings.result", dict)
    problems: list[ContestProblem] = []
    for j, p in enumerate(f.get(result, "problems", "standings.result.problems", list)):
        fld = f"standings.result.problems[{j}]"
        p_cid = f.get(p, "contestId", f"{fld}.contestId", int)
        index = f.get(p, "index", f"{fld}.index", str)
        points = f.get(p, "points", f"{fld}.points", (int, float)) if "points" in p else None
        problems.append(ContestProblem(p_cid, index, None if points is None else float(points)))
    raw_rows: list[tuple[str, float, int]] = []
    for j, row in enumerate(f.get(result, "rows", "standings.result.rows", list)):
        fld = f"standings.result.rows[{j}]"
        party = f.get(row, "party", f"{fld}.party", dict)
        members = f.get(party, "members", f"{fld}.party.members", list)
        if not members:
            raise f.error(f"{fld}.party.members", "empty")
        handle = f.get(members[0], "handle", f"{fld}.party.members[0].handle", str)
        points = f.get(row, "points", f"{fld}.points", (int, float))
        penalty = f.get(row, "penalty", f"{fld}.penalty", int)
        raw_rows.append((handle, float(points), penalty))
    old: list[tuple[str, int]] = []
    for j, ch in enumerate(f.get(changes, "result", "rating_changes.result", list)):
        fld = f"rating_changes.result[{j}]"
        old.append((f.get(ch, "handle", f"{fld}.handle", str), f.get(ch, "oldRating", f"{fld}.oldRating", int)))
    common = {h for h, _, _ in raw_rows} & {h for h, _ in old}
    kept_rows = [r for r in raw_rows if r[0] in common]
    kept_old = [o for o in old if o[0] in common]
    if len(kept_rows) != len(kept_old):
        return (
            f"{len(kept_rows)} standings rows but {len(kept_old)} rating changes after keeping common handles "
            "(repeated handles)"
        )
    old_by_handle = dict(kept_old)
    name = result.get("contest", {}).get("name", "") if isinstance(result.get("contest"), dict) else ""
    return ContestStandings(
        contest_id=cid,
        problems=tuple(problems),
        rows=tuple(StandingsRow(h, pts, pen, old_by_handle[h]) for h, pts, pen in kept_rows),
        name=str(name),
    )


def load_contest_cache(
    path: str | Path, contest_ids: Iterable[int] | None = None
) -> dict[int, ContestStandings | str]:
    """``all_contest_data.json`` -> ``{contest id: ContestStandings or unusable reason}``.

    The file is ``{"<contest id>": {"standings": ..., "rating_changes": ...}, ...}`` (Codeforces API
    responses; :func:`parse_contest_entry`). With ``contest_ids``, other contests are decoded but not
    kept. Values are decoded one at a time, so memory holds the file's text plus one contest.

    Raises:
        UserError: unreadable or invalid JSON, or a malformed entry (file, line or field named).
    """
    path = Path(path)
    wanted = None if contest_ids is None else {int(c) for c in contest_ids}
    out: dict[int, ContestStandings | str] = {}
    for key, entry in _iter_object_items(_read_text(path), path):
        if wanted is not None and key.isdigit() and int(key) not in wanted:
            continue
        parsed = parse_contest_entry(key, entry, path)
        out[int(key)] = parsed
    return out


# ------------------------------------------------------------------------------------ one-call entry
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
