"""The simulated modes: how each one admits groups, updates weights and trains.

Modes (:func:`mode_spec`): ``sync`` (eta 0: generate a batch, train, update; no recompute pass, as in standard
PPO), ``overlap`` (eta 1, whole batches: batch k+1 is generated while batch k trains, with weights one version
old; updates between batches), ``async`` (eta from the scenario, streaming admission, interruptible), and
``async_nointerrupt`` (the same with non-interruptible updates: the ablation of boba² Fig. 5), and, outside the
default set (:data:`ALL_MODES`), ``async_inplace`` (interruptible updates that pause in place: running requests
keep their KV cache across the load and decode on, nothing is re-prefilled; ``rollout.pause_mode: in_place``,
PipelineRL's in-flight weight updates). The synchronous baselines always admit a whole batch (their concurrency
cap is at least the batch size).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from areal_cli.bench.sim.scenario import Scenario

MODES = ("sync", "overlap", "async", "async_nointerrupt")
ALL_MODES = MODES + ("sync_colocated", "async_inplace")
UNBOUNDED_ETA = 1 << 40


@dataclass(frozen=True)
class ModeSpec:
    """How a mode generates and updates weights."""

    name: str
    eta: int
    batch_admission: bool  # admit only when no group is running (whole batches)
    interruptible: bool
    recompute: bool  # decoupled PPO: extra forward pass for proximal logprobs
    chunk_tokens: int
    in_place: bool = False  # interruptible updates keep running requests (and their KV) instead of aborting them


def mode_spec(sc: Scenario, mode: str, eta: int | None = None) -> ModeSpec:
    """The :class:`ModeSpec` of ``mode`` (one of :data:`MODES`); ``eta`` overrides the async modes' eta.

    Raises:
        ValueError: unknown mode.
    """
    e = sc.eta if eta is None else eta
    e = UNBOUNDED_ETA if e < 0 else e
    rec = sc.decoupled_recompute
    if mode == "sync":
        return ModeSpec("sync", 0, True, False, False, 0)
    if mode == "sync_colocated":
        return ModeSpec("sync_colocated", 0, True, False, False, 0)
    if mode == "overlap":
        return ModeSpec("overlap", 1, True, False, rec, 0)
    if mode == "async":
        return ModeSpec("async", e, False, True, rec and e > 0, 0)
    if mode == "async_inplace":
        return ModeSpec("async_inplace", e, False, True, rec and e > 0, 0, in_place=True)
    if mode == "async_nointerrupt":
        return ModeSpec("async_nointerrupt", e, False, False, rec and e > 0, sc.chunk_tokens)
    raise ValueError(f"unknown mode {mode!r} (known: {', '.join(ALL_MODES)})")


def scaled(sc: Scenario, scale: int) -> Scenario:
    """The same cluster shrunk ``scale`` times (servers, training GPUs, batch, concurrency).

    Per-server load, per-GPU training work and step times are unchanged in expectation, so steady-state step
    times match the full cluster up to the spread of the slowest server (fewer servers: a slightly shorter
    synchronous tail). Used to make sweeps fast.
    """
    if scale <= 1:
        return sc
    mc = sc.max_concurrent_groups or sc.batch_size
    return dataclasses.replace(
        sc,
        gen_gpus=max(sc.gen_tp, round(sc.n_servers / scale) * sc.gen_tp),
        train_gpus=max(1, round(sc.train_gpus / scale)),
        batch_size=max(1, round(sc.batch_size / scale)),
        max_concurrent_groups=max(1, round(mc / scale)),
    )

