"""``areal bench throughput``: synchronous vs asynchronous RL measured side by side on this machine.

Modules:
    scenario:   the benchmark's scenario (recipe, shared overrides, run plan) and its YAML files.
    accounting: pure accounting on a run's ``timeline.json`` (busy/idle time, step durations, occupancy).
    analysis:   one run's figures and the modes compared over runs (ratios, accuracy, overlap/straggler split).
    generation: the embedded server's continuous batching vs Hugging Face static ``generate``.
    benchmark:  running it: warm start, interleaved runs, ``results.json`` and plots.
    table:      the terminal table of the results.
    plots:      timelines, throughput bars, accuracy curves and the decomposition (PNG).

This package's names below are what the command (:mod:`areal_cli.commands.bench_throughput`), the staleness
benchmark, ``benchmarks/embedded_vs_hf_generate.py`` and the tests use.
"""

from areal_cli.bench.runs import machine_description
from areal_cli.bench.throughput.accounting import (activity, after_eval, batch_straggler, covered_seconds,
                                                   effective_throughput, mean_occupancy, merge_intervals,
                                                   occupancy_curve, request_intervals, step_durations, sync_stragglers)
from areal_cli.bench.throughput.analysis import (DRIFT_THRESHOLD, accuracy_comparison, decompose_ratio,
                                                 first_crossing, headline, machine_drift, mean_accuracy_curve,
                                                 overlap_ceiling, paired_ratio, steady_state, steady_steps,
                                                 summarize_run, time_to_accuracy)
from areal_cli.bench.throughput.benchmark import SCHEMA, build_results, check_configs, describe_plan, run_benchmark
from areal_cli.bench.throughput.generation import compare_generation
from areal_cli.bench.throughput.scenario import default_scenario, load_scenario, run_plan
from areal_cli.bench.throughput.table import results_table

__all__ = ["DRIFT_THRESHOLD", "SCHEMA", "accuracy_comparison", "activity", "after_eval", "batch_straggler", "build_results", "check_configs",
           "compare_generation", "covered_seconds", "decompose_ratio", "default_scenario", "describe_plan", "effective_throughput",
           "first_crossing", "headline", "load_scenario", "machine_description", "machine_drift", "mean_accuracy_curve", "mean_occupancy",
           "merge_intervals", "occupancy_curve", "overlap_ceiling", "paired_ratio", "request_intervals",
           "results_table", "run_benchmark", "run_plan", "steady_state", "steady_steps", "step_durations",
           "summarize_run", "sync_stragglers", "time_to_accuracy"]
