"""The pass/fail comparison of measured figures with a recipe's expected metrics: one :class:`Check` row per
relevant entry, never a pass for what was not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from areal_cli.recipes.expected import ExpectedFile
from areal_cli.recipes.tolerance import Mode, binomial_tolerance, unit_scale


@dataclass
class Measured:
    """One measured figure: value in the expected entry's unit; ``n_problems`` lets :func:`compare`
    derive a tolerance when the expected entry cannot (unknown N)."""

    value: float
    n_problems: int | None = None
    n_samples: int | None = None


@dataclass
class Check:
    """One row of a reproduction report."""

    key: str
    benchmark: str
    metric: str
    expected: float
    measured: float | None
    tolerance: float | None
    status: Literal["pass", "fail", "skipped"]
    reason: str
    source: str
    unit: str


def compare(expected: ExpectedFile, measured: dict[str, Measured | float], *, mode: Mode = "eval_only",
            subject: Literal["published", "base"] = "published", variant: str | None = None) -> list[Check]:
    """Compare measured figures with the expected ones: one :class:`Check` per relevant entry.

    Relevant entries: mode ``eval_only`` -> entries of ``subject`` (the checkpoint that was evaluated);
    mode ``retrain`` -> entries of the published and trained-only models; both restricted to ``variant``.
    A row is ``skipped`` (never pass) when the benchmark is not evaluated by areal, the entry is
    report-only, the figure was not measured, or no tolerance can be derived; ``pass``/``fail`` otherwise.

    Args:
        measured: ``ExpectedMetric.key`` -> :class:`Measured` or a bare value, in the entry's unit.
    """
    models = {subject} if mode == "eval_only" else {"published", "trained"}
    rows = []
    for m in expected.metrics:
        if m.model not in models or m.variant != variant:
            continue
        got = measured.get(m.key)
        if got is not None and not isinstance(got, Measured):
            got = Measured(float(got))
        row = dict(key=m.key, benchmark=m.benchmark, metric=m.metric, expected=m.value,
                   measured=None if got is None else got.value, source=m.source, unit=m.unit)
        tol = getattr(m.tolerance, mode) if m.tolerance is not None else None
        if not m.evaluated:
            rows.append(Check(**row, tolerance=tol, status="skipped", reason=m.evaluated_note or "not evaluated"))
            continue
        if m.check == "report":
            why = "reported, not checked" + (f": {m.note}" if m.note else "")
            rows.append(Check(**row, tolerance=None, status="skipped", reason=why))
            continue
        if got is None:
            rows.append(Check(**row, tolerance=tol, status="skipped", reason="not measured"))
            continue
        if tol is None and m.tolerance_formula == "binomial-mean":
            n = got.n_problems
            k = m.n_samples if got.n_samples is None else got.n_samples
            if n and k:
                s = unit_scale(m.unit)
                tol = binomial_tolerance(min(max(m.value / s, 0.0), 1.0), n, k, expected.z)[mode] * s
        if tol is None:
            rows.append(Check(**row, tolerance=None, status="skipped",
                              reason="no tolerance: n_problems unknown in the expected file and the measurement"))
            continue
        if m.check == "within":
            ok = abs(got.value - m.value) <= tol
            reason = f"|{got.value:g} - {m.value:g}| {'<=' if ok else '>'} {tol:.3g}"
        else:
            ok = got.value >= m.value - tol
            reason = f"{got.value:g} {'>=' if ok else '<'} {m.value:g}" + (f" - {tol:.3g}" if tol else "")
        rows.append(Check(**row, tolerance=tol, status="pass" if ok else "fail", reason=reason))
    return rows
