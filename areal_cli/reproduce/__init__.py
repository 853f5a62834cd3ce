"""``areal reproduce NAME``: plan a locked recipe's reproduction, run it, compare with the expected metrics.

Steps (:func:`reproduce`):

1. **Plan** (:func:`make_plan`; ``--dry-run`` prints it and stops, writing nothing): the recipe, model /
   data / published checkpoint at their revisions, what would be downloaded (unpinned parts flagged), GPUs
   needed, the allocation string parsed and placed on the nodes (:func:`recipe_placement`; ``--nodes`` /
   ``--gpus-per-node`` place it on other hardware), estimated hours (:func:`estimate_hours`),
   the evaluation (protocol, benchmarks, sampling) and the expected metrics with the tolerance of the mode.
2. **Run**: mode ``retrain`` trains the recipe (``trainer: cpu`` recipes on this machine with
   :func:`areal_cli.train_loop.run_training`; ``trainer: gpu`` recipes need their cluster and are refused
   with one line); mode ``eval_only`` (``--eval-only``) downloads the published checkpoint (or, with
   ``--subject base``, the base model) at its pinned revision and runs ``areal eval`` with the recipe's
   evaluation settings, one run per benchmark (each with its date window and the expected entries'
   ``eval_overrides``).
3. **Compare** (:func:`areal_cli.recipes.compare`) and print a pass / fail / skipped table. GPQA-Diamond and
   any number ``areal`` cannot measure are *skipped*, never passed.
4. **Record**: ``DIR/manifest.json`` (:mod:`areal_cli.foundations.manifest`: recipe sha256, revisions, package
   versions, git commit, hardware, times) and ``DIR/reproduce.json`` (every check and measured figure).

Exit codes: 0 when every check passes (skipped rows allowed) and at least one check was made; 1 on any
failed check, or when nothing could be checked; 2 on bad input (unknown recipe, invalid override, out
directory holding a run, corrupted checkpoint, missing download, GPU recipe without its GPUs): one line,
raised as :class:`~areal_cli.foundations.errors.UserError` before anything is written.

Modules: :mod:`~areal_cli.reproduce.hours` (training-time estimates), :mod:`~areal_cli.reproduce.plan` (what a
run will do), :mod:`~areal_cli.reproduce.render` (plan and check tables, exit code),
:mod:`~areal_cli.reproduce.measure` (measured figures from a training run or an eval result),
:mod:`~areal_cli.reproduce.checkpoints` (checkpoint integrity), :mod:`~areal_cli.reproduce.run` (the run and its
records).

Imports at module load: stdlib, yaml (via :mod:`areal_cli.recipes`); rich, torch and the eval stack only when
a step needs them.
"""

from areal_cli.reproduce.checkpoints import check_checkpoint
from areal_cli.reproduce.hours import ANCHOR_RECIPE, HoursEstimate, estimate_hours, model_params_b, rough_hours
from areal_cli.reproduce.measure import TRAINING_METRICS, measured_from_eval, measured_from_training
from areal_cli.reproduce.plan import (
    EvalGroup,
    Plan,
    eval_groups,
    make_plan,
    parse_eval_overrides,
    recipe_placement,
    relevant_entries,
)
from areal_cli.reproduce.render import count_checks, exit_code_for, fmt_tolerance, fmt_value, render_checks, render_plan
from areal_cli.reproduce.run import RUN_MARKERS, Outcome, check_out_dir, default_out_dir, reproduce

__all__ = [
    "ANCHOR_RECIPE", "EvalGroup", "HoursEstimate", "Outcome", "Plan", "RUN_MARKERS", "TRAINING_METRICS",
    "check_checkpoint", "check_out_dir", "count_checks", "default_out_dir", "estimate_hours", "eval_groups",
    "exit_code_for", "fmt_tolerance", "fmt_value", "make_plan", "measured_from_eval", "measured_from_training",
    "model_params_b", "parse_eval_overrides", "recipe_placement", "relevant_entries", "render_checks",
    "render_plan", "reproduce", "rough_hours",
]
