"""``areal bench staleness``: the staleness ablation (AReaL v0.3 blog, Table 3) on this machine.

AReaL trained R1-Distill-Qwen-1.5B with the maximum staleness eta in {0, 1, 2, 4, 8, 16, inf}, once with naive PPO
(the behaviour policy as the proximal one) and once with the decoupled PPO loss: AIME24 at eta 4 fell to 23.3 with
naive PPO and stayed at 42.2 with the decoupled loss. This benchmark runs the same grid on a built-in task (default
``tiny-longtail``, with weight updates that pause the servers in place, so that the asynchronous pipeline runs ahead
of the trainer: in 40 steps the trained samples are about eta versions old up to eta 4, 0.57-0.76 eta at eta 8 and
0.32-0.48 eta at 16, as measured; the realised staleness is reported per run) and reports, per variant and eta:

- **final held-out accuracy** (greedy, the task's fixed held-out prompts) after the same number of RL steps,
  mean and spread over seeds;
- **time to target**: RL seconds (the runs evaluate after their RL loop, ``loop.eval_deferred``, from the
  weights kept at each evaluation step, so no evaluation hands the rollout side free generation time) until the seed-averaged accuracy curve first reaches
  the target (the scenario's ``target_accuracy``, or by default the synchronous runs' mean final accuracy);
- **realised staleness**: mean versions between a trained sample's first token and the step that trains it
  (AReaL's head off-policyness), and the off-policy statistics of the loss (``iw_capped_frac``, ``clip_frac``,
  ``iw_truncated_frac``) averaged over steps.

Variants (:data:`VARIANTS`; a scenario may also define its own as ``{name: {recipe field: value}}``):

=============================  =====================================================================================
``naive``                      proximal := behaviour (``ppo.recompute_proximal: false``): standard PPO on stale data
``decoupled``                  decoupled PPO, AReaL's correction: tokens with pi_prox/pi_behav above the cap masked
``decoupled-none``             decoupled PPO without any behaviour-weight correction (``behav_imp_weight_mode:
                               disabled``): what the proximal policy alone buys
``decoupled-token_truncate``   the weight truncated at the cap (TIS) instead of masked
``decoupled-sequence_mask``    one weight per sequence (geometric mean), sequences above the cap masked (MIS)
``decoupled-sequence_truncate`` the per-sequence weight truncated at the cap
``decoupled-icepop``           token mask with IcePop's lower bound 0.5 as well
=============================  =====================================================================================

With eta = 0 every variant is the same algorithm (every token comes from the policy being trained, so the
proximal policy is the behaviour policy and every weight is 1): one synchronous run per seed stands for all of
them (standard PPO: no proximal pass).

Runs share one supervised warm start (excluded from every time) and the split of the cores of ``areal bench
throughput`` (trainer on one core, rollout server + controller process on the other); repeat r uses seed
``recipe seed + r``. Writes ``DIR/results.json``, ``DIR/table.md``, ``DIR/staleness.png`` and one folder per run
under ``DIR/runs/``.

Modules:
    scenario:  the grid (etas, variants, seeds), :data:`VARIANTS`, its YAML files and :func:`run_plan`.
    analysis:  one run's figures, the grid's cells and ``results.json``.
    report:    the table (terminal, Markdown) and ``staleness.png``.
    benchmark: running it (:func:`run_ablation`).
"""

from areal_cli.bench.staleness.analysis import SCHEMA, aggregate, build_results, summarize_run
from areal_cli.bench.staleness.benchmark import run_ablation
from areal_cli.bench.staleness.report import plot_staleness, results_table, table_markdown
from areal_cli.bench.staleness.scenario import (DEFAULT_SCENARIO, SYNC_OVERRIDES, VARIANTS, Scenario, default_scenario,
                                                load_scenario, run_plan, scenario_from_dict)

__all__ = ["DEFAULT_SCENARIO", "SCHEMA", "SYNC_OVERRIDES", "Scenario", "VARIANTS", "aggregate", "build_results",
           "default_scenario", "load_scenario", "plot_staleness", "results_table", "run_ablation", "run_plan",
           "scenario_from_dict", "summarize_run", "table_markdown"]
