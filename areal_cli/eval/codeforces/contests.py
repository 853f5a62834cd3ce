"""The Codeforces data model of the rating estimate: problems and ids, rated standings, our attempts at a
contest, and the per-contest and overall estimates (package docstring)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

# AReaL ``format_grouped_contest_data``: ``re.match(r'(\d+)([A-Z].*)', problem_id)``.
PROBLEM_ID_RE = re.compile(r"(\d+)([A-Z].*)")


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
    """The estimate for one contest (fields as in the package docstring's steps)."""

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


def split_problem_id(problem_id: str) -> tuple[int, str]:
    """``"2000A"`` -> ``(2000, "A")``; ``"1910B1"`` -> ``(1910, "B1")`` (AReaL's regex).

    Raises:
        ValueError: not digits followed by an upper-case letter.
    """
    m = PROBLEM_ID_RE.fullmatch(str(problem_id))
    if m is None:
        raise ValueError(f"invalid Codeforces problem id {problem_id!r} (expected e.g. '2000A')")
    return int(m.group(1)), m.group(2)
