"""``areal bench simulate``'s discrete-event model of an RL cluster: sync vs overlap vs async throughput.

Modules:
    scenario:  the cluster, workload and cost constants (:class:`Scenario`) and its YAML files.
    costs:     per-operation costs, given or derived from hardware and model size (:func:`derive_costs`).
    modes:     sync / overlap / async / async_nointerrupt (:func:`mode_spec`) and shrinking a cluster (:func:`scaled`).
    lengths:   the response-length distribution (lognormal or empirical).
    events:    the event loop (:class:`~areal_cli.bench.sim.events.ClusterSim`).
    steady_state: a run's steady-state figures (:func:`simulate`).
    analysis:  modes compared, the async/sync ratio, sensitivity, scaling and eta sweeps.
    calibrate: fitting constants to published step times or to a measured run; a machine's constants carried
               to another workload (:func:`with_machine_of`).
    engine_costs: decode and prefill constants from the engines' recorded step costs.

This package's names below are what the command (:mod:`areal_cli.commands.bench_simulate`) and the tests use.
"""

from areal_cli.bench.sim.analysis import (SENSITIVITY_INPUTS, async_sync_ratio, compare_modes, eta_sweep, scaling,
                                          sensitivity, sensitivity_inputs, split_gpus)
from areal_cli.bench.sim.calibrate import (MACHINE_FIELDS, calibrate_from_run, fit_constants, fit_to_published,
                                           with_machine_of)
from areal_cli.bench.sim.costs import derive_costs
from areal_cli.bench.sim.lengths import length_stats
from areal_cli.bench.sim.modes import MODES
from areal_cli.bench.sim.scenario import Scenario, apply_overrides, known_scenarios, load_scenario, scenario_yaml
from areal_cli.bench.sim.steady_state import simulate

__all__ = ["MACHINE_FIELDS", "MODES", "SENSITIVITY_INPUTS", "Scenario", "apply_overrides", "async_sync_ratio", "calibrate_from_run",
           "compare_modes", "derive_costs", "eta_sweep", "fit_constants", "fit_to_published", "known_scenarios",
           "length_stats", "load_scenario", "scaling", "scenario_yaml", "sensitivity", "sensitivity_inputs", "simulate", "split_gpus",
           "with_machine_of"]
