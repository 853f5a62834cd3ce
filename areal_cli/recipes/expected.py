"""Expected-metrics files (``recipes/<name>.expected.yaml``): each published number with its source and a
tolerance that must equal its formula (:mod:`areal_cli.recipes.tolerance`), validated against its recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from areal_cli.recipes.tolerance import (
    CF_CONTESTS,
    CF_PERCENTILE_PER_ELO,
    Tolerance,
    binomial_tolerance,
    codeforces_rating_tolerance,
    unit_scale,
)


@dataclass
class ExpectedMetric:
    """One published number.

    ``model``: which weights the number belongs to: ``published`` (the released checkpoint; also the target
    of a retrain), ``base`` (the starting model), ``trained`` (only obtainable by retraining: no released
    checkpoint). ``check``: ``within`` (|m - v| <= tol), ``at_least`` (m >= v - tol), ``report`` (shown,
    never pass/fail: e.g. hardware-dependent wall-clock hours).
    """

    benchmark: str
    metric: str
    unit: Literal["percent", "fraction", "elo", "hours", "ratio", "count"]
    value: float
    model: Literal["published", "base", "trained"]
    check: Literal["within", "at_least", "report"]
    source: str
    tolerance_formula: Literal["binomial-mean", "codeforces-rating", "codeforces-percentile", "target", "none"]
    variant: str | None = None
    headline: bool = False
    evaluated: bool = True
    evaluated_note: str | None = None
    n_problems: int | None = None
    n_samples: int | None = None
    n_contests: int | None = None
    tolerance: Tolerance | None = None
    eval_overrides: dict = field(default_factory=dict)
    note: str | None = None

    @property
    def key(self) -> str:
        """``benchmark/metric`` plus ``@variant`` and ``#model`` when not the defaults: the key of
        measured values passed to :func:`compare`."""
        k = f"{self.benchmark}/{self.metric}"
        if self.variant:
            k += f"@{self.variant}"
        if self.model == "base":
            k += "#base"
        return k


@dataclass
class ExpectedFile:
    recipe: str
    z: float
    metrics: list[ExpectedMetric]


#: Eval settings an expected entry may override (``eval_overrides``; also ``areal reproduce --eval-only -o``):
#: key -> its type in ``areal eval``.
EVAL_OVERRIDE_KEYS = {"temperature": float, "top_p": float, "n_samples": int, "protocol": str, "max_new_tokens": int}


def expected_tolerance(m: ExpectedMetric, z: float) -> Tolerance | None:
    """The tolerance ``m`` must carry according to its formula (None when it has none).

    Raises:
        ValueError: the entry lacks what the formula needs (N, k, C).
    """
    f = m.tolerance_formula
    if f == "binomial-mean":
        if m.n_problems is None or m.n_samples is None:
            return None  # derived at compare time from the measured N (see compare)
        s = unit_scale(m.unit)
        t = binomial_tolerance(m.value / s, m.n_problems, m.n_samples, z)
        return Tolerance(eval_only=t["eval_only"] * s, retrain=t["retrain"] * s)
    if f == "codeforces-rating":
        t = codeforces_rating_tolerance(m.n_contests or CF_CONTESTS, z)
        return Tolerance(t, t)
    if f == "codeforces-percentile":
        t = CF_PERCENTILE_PER_ELO * codeforces_rating_tolerance(m.n_contests or CF_CONTESTS, z)
        return Tolerance(t, t)
    if f == "target":
        return Tolerance(0.0, 0.0)
    return None


def check_tolerance(m: ExpectedMetric, z: float, bad) -> None:
    """Check that entry ``m`` carries what its ``check`` and ``tolerance_formula`` need, and that its stored
    tolerance equals the formula's (z = ``z``), so an expected file cannot drift from recipes/README.md.

    Args:
        bad: ``bad(key, why) -> UserError`` naming the entry's ``file:line`` and field.
    Raises:
        UserError: from ``bad``.
    """
    if m.tolerance_formula == "binomial-mean":
        if m.unit not in ("percent", "fraction"):
            raise bad("unit", "binomial-mean needs unit percent or fraction")
        if not 0 <= m.value / unit_scale(m.unit) <= 1:
            raise bad("value", f"{m.value} is not a {m.unit} in [0, 1]")
        if m.n_samples is None:
            raise bad("n_samples", "binomial-mean needs n_samples (samples per problem)")
    if m.tolerance_formula.startswith("codeforces") and m.n_contests is None:
        raise bad("n_contests", "a Codeforces tolerance needs n_contests")
    if m.check == "report":
        if m.tolerance is not None or m.tolerance_formula != "none":
            raise bad("check", "a 'report' entry has tolerance: null and tolerance_formula: none")
        return
    if m.tolerance_formula == "none":
        raise bad("tolerance_formula", f"check '{m.check}' needs a tolerance formula")
    want = expected_tolerance(m, z)
    if want is None:
        if m.tolerance is not None:
            raise bad("tolerance", "must be null when n_problems is unknown (derived from the measured run)")
        if m.tolerance_formula == "binomial-mean" and m.n_problems is None and not m.note:
            raise bad("note", "n_problems: null needs a note saying why")
        return
    if m.tolerance is None:
        raise bad("tolerance", f"missing; the formula gives eval_only={want.eval_only:.2f}, retrain={want.retrain:.2f}")
    for mode in ("eval_only", "retrain"):
        got, exp = getattr(m.tolerance, mode), getattr(want, mode)
        if abs(got - exp) > 0.01 * abs(exp) + 1e-9:  # files store 4 significant digits
            raise bad("tolerance", f"{mode}={got} disagrees with {m.tolerance_formula} (z={z}): {exp:.4g}")
