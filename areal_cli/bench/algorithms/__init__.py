"""``areal bench algorithms``: the algorithm presets (``ppo.algorithm``) side by side on one task and machine.

Every preset (default: grpo, ppo, dr_grpo, dapo, gspo, rloo, cispo) trains from one shared supervised warm start on the
same recipe (default ``tiny-arith``) at the recipe's asynchronous eta, for the same number of RL steps, once per
seed (default 3); the runs are interleaved seed-major (each seed runs every preset, the order reversed on odd
seeds), so drift of the machine hits every preset alike. Per preset, mean ± spread over seeds:

- **final held-out accuracy** (greedy, the task's fixed held-out prompts) and the best one;
- **time to target**: RL seconds until a run's accuracy first reaches the target (``--target``, default the
  recipe's ``loop.target_accuracy``); runs that never do are counted, "not reached" when none does;
- **staleness** (mean versions between a trained sample's first token and its training step), the mean
  **importance weight** ``iw_mean`` (pi_prox / pi_behav over loss tokens, averaged over steps) and its median
  ``iw_p50``, the engine-vs-trainer **logprob mismatch** and ``zero_std_group_frac`` (dead groups).

Writes ``DIR/results.json`` (every run's figures, the settings, the preset keys in force, the machine),
``DIR/table.md``, ``DIR/algorithms.png`` and one folder per run under ``DIR/runs/``.

Modules:
    plan:      the settings, the run order and each run's configuration.
    analysis:  one run's figures, the per-preset aggregate and ``results.json``.
    report:    the table (terminal, Markdown) and ``algorithms.png``.
    benchmark: running it (:func:`run_algorithms`) and the ``--dry-run`` estimate.
"""

from areal_cli.bench.algorithms.analysis import SCHEMA, aggregate, build_results, summarize_run
from areal_cli.bench.algorithms.benchmark import estimate_lines, run_algorithms
from areal_cli.bench.algorithms.plan import (DEFAULT_PRESETS, Settings, check_configs, check_settings, run_label,
                                             run_plan)
from areal_cli.bench.algorithms.report import plot_curves, results_table, table_markdown

__all__ = ["DEFAULT_PRESETS", "SCHEMA", "Settings", "aggregate", "build_results", "check_configs", "check_settings",
           "estimate_lines", "plot_curves", "results_table", "run_algorithms", "run_label", "run_plan",
           "summarize_run", "table_markdown"]
