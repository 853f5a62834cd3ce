"""Steady-state figures of the cluster model: :func:`simulate` runs the event loop
(:class:`~areal_cli.bench.sim.events.ClusterSim`) for one mode and turns its two snapshots (the end of warm-up
and the end of the run) into throughputs, busy and idle fractions and the staleness histogram.

Outputs (:func:`simulate`): effective training throughput (tokens of trained sequences per second, as in
boba²: generated-but-unused tokens do not count), generation throughput, idle fractions, staleness histogram,
seconds per step and hours for ``steps`` steps. Units: seconds, tokens.
"""

from __future__ import annotations

import dataclasses

from areal_cli.bench.sim.costs import Costs, derive_costs
from areal_cli.bench.sim.events import ClusterSim
from areal_cli.bench.sim.lengths import load_empirical_lengths
from areal_cli.bench.sim.modes import UNBOUNDED_ETA, mode_spec, scaled
from areal_cli.bench.sim.scenario import Scenario

__all__ = ["simulate"]


def simulate(sc: Scenario, mode: str, *, eta: int | None = None, scale: int = 1, seed: int | None = None,
             costs: Costs | None = None) -> dict:
    """Simulate ``sc.sim_steps`` training steps of ``mode`` and report steady-state figures.

    Args:
        sc: the scenario.
        mode: one of :data:`ALL_MODES` (``sync_colocated``: synchronous with every GPU generating and then
            every GPU training, as verl does; the weight load cost stays).
        eta: overrides the scenario's eta for the async modes (-1 = unbounded).
        scale: shrink the cluster this many times (:func:`scaled`) for speed.
        seed: random seed (default: the scenario's).
        costs: explicit costs (default: :func:`derive_costs` of the scaled scenario).
    Returns:
        dict with ``step_s`` (mean seconds per step after warm-up), ``effective_tokens_per_s`` (trained
        tokens / s), ``gen_tokens_per_s``, ``gen_idle_frac`` / ``gen_prefill_frac`` / ``gen_load_frac`` /
        ``gen_decode_frac`` (fractions of server time), ``trainer_idle_frac`` / ``trainer_train_frac`` /
        ``trainer_save_frac``, ``staleness`` (lag -> fraction of trained samples), ``staleness_mean``,
        ``staleness_max``, ``interrupted_per_step``, ``tokens_per_step``, ``mean_running_per_server``,
        ``fill_s`` (time to the end of warm-up) and ``hours`` (predicted hours for ``sc.steps`` steps), all scaled
        back to the full cluster for throughputs.
    Raises:
        ValueError: unknown mode.
    """
    spec = mode_spec(sc, mode, eta)
    if mode == "sync_colocated":  # verl-style: every GPU generates, then every GPU trains
        total = sc.gen_gpus + sc.train_gpus
        sc = dataclasses.replace(sc, gen_gpus=total // sc.gen_tp * sc.gen_tp, train_gpus=total)
    s = scaled(sc, scale)
    c = costs or derive_costs(s)
    sim = ClusterSim(s, spec, c, sc.seed if seed is None else seed, load_empirical_lengths(sc))
    sim.run()
    a, z = sim.snap, sim.snap_end
    if a is None or z is None:  # pragma: no cover - run() only returns once both exist
        raise RuntimeError("missing snapshots")
    window = z["t"] - a["t"]
    n_steps = s.sim_steps - s.warmup_steps
    srv_time = window * len(sim.servers)
    hist = {k: z["stale_hist"].get(k, 0) - a["stale_hist"].get(k, 0) for k in z["stale_hist"]}
    n_samples = sum(hist.values()) or 1
    stale = {int(k): v / n_samples for k, v in sorted(hist.items()) if v}
    up = sc.n_servers / len(sim.servers)  # throughputs back to the full cluster
    # trained tokens: steps warmup+1..sim_steps are those whose training started after the first snapshot
    trained = sum(sim.step_tokens[s.warmup_steps:s.sim_steps])
    step_s = window / n_steps
    decode_s = z["decode_s"] - a["decode_s"]
    gen_tokens = z["tokens"] - a["tokens"]
    out = {
        "mode": spec.name,
        "eta": None if spec.eta >= UNBOUNDED_ETA else spec.eta,
        "interruptible": spec.interruptible,
        "step_s": step_s,
        "effective_tokens_per_s": trained / window * up,
        "gen_tokens_per_s": gen_tokens / window * up,
        "tokens_per_step": trained / n_steps * up,
        "gen_decode_frac": decode_s / srv_time,
        "gen_prefill_frac": (z["prefill_s"] - a["prefill_s"]) / srv_time,
        "gen_load_frac": (z["load_s"] - a["load_s"]) / srv_time,
        "trainer_train_frac": (z["train_s"] - a["train_s"]) / window,
        "trainer_save_frac": (z["save_s"] - a["save_s"]) / window,
        "trainer_overhead_frac": (z["overhead_s"] - a["overhead_s"]) / window,
        "staleness": stale,
        "staleness_mean": sum(k * v for k, v in stale.items()),
        "staleness_max": max(stale, default=0),
        "interrupted_per_step": (z["interrupted"] - a["interrupted"]) / n_steps * up,
        "mean_running_per_server": gen_tokens / max(z["decode_steps"] - a["decode_steps"], 1e-9),
        "fill_s": a["t"],
        "hours": (a["t"] + (sc.steps - s.warmup_steps) * step_s) / 3600.0,
        "scale": scale,
    }
    out["gen_idle_frac"] = max(0.0, 1.0 - out["gen_decode_frac"] - out["gen_prefill_frac"] - out["gen_load_frac"])
    out["trainer_idle_frac"] = max(0.0, 1.0 - out["trainer_train_frac"] - out["trainer_save_frac"]
                                   - out["trainer_overhead_frac"])
    return out
