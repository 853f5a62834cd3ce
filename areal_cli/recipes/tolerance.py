"""Tolerances from sampling error: how far a re-measured number may fall from the published one.

The published value and a re-measurement are two independent draws of the same estimator, so a tolerance bounds
their difference, ``z * sd(difference)`` (:data:`Z_DEFAULT` = 3): :func:`binomial_tolerance` for means of
samples (pass@1, accuracy), :func:`codeforces_rating_tolerance` for a mean Elo over contests. Derivations in
the docstrings and in ``recipes/README.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


#: Default z for tolerances: |measured - published| <= z * sd(difference).
Z_DEFAULT = 3.0
#: Codeforces: contests in AReaL's Codeforces set (docs/tutorial/eval.md "57 Codeforces contests").
CF_CONTESTS = 57
#: Codeforces: assumed SD of one contest's performance rating, Elo points (Elo's per-game performance
#: model: each player's performance ~ Normal(sd 200), so a difference has sd 200*sqrt(2) ~= 283).
CF_SIGMA_CONTEST = 200 * math.sqrt(2)
#: Codeforces percentile per Elo point near 1880-2050, from the published (rating, percentile) pairs
#: Qwen3-8B 1879/96.7 and AReaL-boba2-14B 2044/98.2: (98.2 - 96.7) / (2044 - 1879).
CF_PERCENTILE_PER_ELO = (98.2 - 96.7) / (2044 - 1879)

Mode = Literal["eval_only", "retrain"]


def binomial_tolerance(p: float, n_problems: int, n_samples: int, z: float = Z_DEFAULT) -> dict[str, float]:
    """Tolerance for a mean-of-samples score (pass@1, accuracy), as a fraction.

    The published value and a re-measurement are two independent draws of the same estimator, so the
    tolerance bounds their difference: ``z * sqrt(2 * var)``.

    - eval_only (re-evaluating the fixed published checkpoint): the estimator averages k samples on each
      of N problems; Var = (1/N^2) sum_i p_i(1-p_i)/k <= p(1-p)/(N k) (concavity of p(1-p)).
    - retrain (a retrained model): per-problem scores are any [0,1] variables with mean m_i, whose variance
      is at most m_i(1-m_i), so Var <= p(1-p)/N if problems are independent (systematic run-to-run
      shifts are not covered).

    Args:
        p: the published value as a fraction in [0, 1]; n_problems: N; n_samples: k per problem.
    Returns:
        ``{"eval_only": z*sqrt(2 p(1-p)/(N k)), "retrain": z*sqrt(2 p(1-p)/N)}`` (fractions).
    """
    if not 0 <= p <= 1 or n_problems <= 0 or n_samples <= 0:
        raise ValueError(f"need 0 <= p <= 1, N > 0, k > 0 (got p={p}, N={n_problems}, k={n_samples})")
    var = p * (1 - p)
    return {"eval_only": z * math.sqrt(2 * var / (n_problems * n_samples)),
            "retrain": z * math.sqrt(2 * var / n_problems)}


def codeforces_rating_tolerance(n_contests: int = CF_CONTESTS, z: float = Z_DEFAULT,
                                sigma: float = CF_SIGMA_CONTEST) -> float:
    """Tolerance on the Codeforces rating (Elo points) = z * sqrt(2) * sigma / sqrt(C).

    AReaL's rating is the mean over C contests of a per-contest performance rating; assuming those are
    independent with SD ``sigma`` (:data:`CF_SIGMA_CONTEST`), the mean has SD sigma/sqrt(C), and the
    difference of two such means sqrt(2) times that. Same for eval_only and retrain (the contest-level
    spread dominates). With C = 57, z = 3: 159 Elo.
    """
    return z * math.sqrt(2) * sigma / math.sqrt(n_contests)


@dataclass
class Tolerance:
    """Allowed |measured - published| in the metric's unit, per reproduction mode."""

    eval_only: float
    retrain: float


def unit_scale(unit: str) -> float:
    """Values per fraction in ``unit``: 100 for ``percent``, else 1 (tolerances are computed on fractions)."""
    return 100.0 if unit == "percent" else 1.0
