"""Training hours of a recipe: the published wall-clock figure when its expected file has one, else a rough
estimate scaled from one published run (:data:`ANCHOR_RECIPE`) by model size, samples per step and GPUs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from areal_cli.foundations.errors import UserError
from areal_cli.recipes import TRAINING_FIGURES, ExpectedMetric, Recipe, load_recipe


#: The published run that rough hour estimates are scaled from (its expected file has wall-clock hours
#: for the async run and for its ``sync`` variant).
ANCHOR_RECIPE = "async-7b-math"


@dataclass
class HoursEstimate:
    """Wall-clock hours of a training run: ``hours`` (None when it cannot be estimated), ``per_100_steps``
    (rough estimates), and ``basis``: where the figure comes from ("published: ..." / "rough: ..." /
    "not estimated: ...")."""

    hours: float | None
    per_100_steps: float | None
    basis: str

    def text(self) -> str:
        if self.hours is not None:
            return f"{self.hours:.1f} h ({self.basis})"
        if self.per_100_steps is not None:
            return f"{self.per_100_steps:.2f} h per 100 steps ({self.basis})"
        return self.basis


def model_params_b(repo: str | None) -> float | None:
    """Parameters in billions read from a Hub repo name (``Qwen/Qwen3-14B`` -> 14.0), None if absent."""
    m = re.search(r"(\d+(?:\.\d+)?)B\b", repo or "")
    return float(m.group(1)) if m else None


def _published_hours(recipe: Recipe, variant: str | None) -> ExpectedMetric | None:
    for m in recipe.expected.metrics:
        if m.benchmark == TRAINING_FIGURES and m.metric == "wall_clock_hours" and m.variant == variant:
            return m
    return None


def rough_hours(recipe: Recipe, variant: str | None, anchor: Recipe) -> HoursEstimate:
    """Rough training hours scaled linearly from the published run ``anchor`` (:data:`ANCHOR_RECIPE`).

    Rule: hours per step = anchor's hours per step x (model parameters / anchor's) x (samples per step /
    anchor's) x (anchor's GPUs / GPUs); the synchronous anchor (variant ``sync``) for eta 0, else the
    asynchronous one. It ignores response lengths, sequence-length caps and fixed costs: applied to the
    other published pair (async-1.5b-math: 14.8 h async, 41.0 h sync) it gives 8.2 h and 18.5 h (1.8x and
    2.2x low), so read it as a factor-of-3 figure (tests/test_reproduce.py checks that bound).
    """
    spec = recipe.variant(variant)
    sync = spec.max_head_offpolicyness == 0
    ref_variant = "sync" if sync and "sync" in anchor.file.variants else None
    ref_m = _published_hours(anchor, ref_variant)
    ref_spec = anchor.variant(ref_variant)
    p, p_ref = model_params_b(recipe.file.model.repo), model_params_b(anchor.file.model.repo)
    if ref_m is None or ref_spec.max_steps is None or p is None or p_ref is None:
        return HoursEstimate(None, None, "not estimated: model size or the reference run's steps unknown")
    per_step = (ref_m.value / ref_spec.max_steps * (p / p_ref)
                * (spec.batch_size * spec.group_size) / (ref_spec.batch_size * ref_spec.group_size)
                * anchor.file.resources.gpus / recipe.file.resources.gpus)
    basis = (f"rough, within ~3x: scaled from {anchor.name}{'@' + ref_variant if ref_variant else ''}'s published "
             f"{ref_m.value:g} h by model size, samples per step and GPUs")
    if spec.max_steps is None:
        return HoursEstimate(None, 100 * per_step, basis + "; total steps not published "
                                                           "(epochs x training prompts / batch)")
    return HoursEstimate(per_step * spec.max_steps, 100 * per_step, basis)


def estimate_hours(recipe: Recipe, variant: str | None = None) -> HoursEstimate:
    """Training hours of ``recipe``: the published wall-clock figure when its expected file has one, else
    :func:`rough_hours` for PPO recipes; CPU and SFT recipes are not estimated (said why)."""
    m = _published_hours(recipe, variant)
    if m is not None:
        return HoursEstimate(m.value, None, f"published: {m.source.strip()}")
    if recipe.trainer == "cpu":
        return HoursEstimate(None, None, "CPU recipe: minutes, not hours (see the description)")
    if recipe.kind == "sft":
        return HoursEstimate(None, None, "not estimated: SFT time is data size x epochs (size not in the recipe)")
    try:
        anchor = load_recipe(ANCHOR_RECIPE)
    except UserError:
        return HoursEstimate(None, None, f"not estimated: reference recipe {ANCHOR_RECIPE} unavailable")
    return rough_hours(recipe, variant, anchor)
