"""A run of ``areal train``: setup, the supervised warm start and the asynchronous RL loop, top to bottom.

Processes (DESIGN §3): this process runs the rollout controller (asyncio) and the Megatron-core trainer
(its steps in a worker thread, so rollouts keep streaming while it trains); ``rollout.n_servers`` rollout servers
run as child processes (:mod:`areal_cli.train_loop.processes`); rewards are computed in a worker-process pool. With
``parallel.data x parallel.tensor x parallel.pipeline > 1`` the trainer is a group of
torchrun ranks instead. Every trainer use goes through the group (:mod:`areal_cli.trainer.group`): engine
methods by name and the trainer-side functions of :mod:`areal_cli.trainer.steps`, which run on every rank
with the same arguments.

What is trained is the run's task (:mod:`areal_cli.tasks.task`): records, prompt rendering, reward function
and rollout workflow, each pluggable by ``module:attr`` (:mod:`areal_cli.api`).

1. Read the task's records (bad data fails here, before anything starts), build the embedded tiny model
   (or use ``model.path``), start the servers and the reward pool.
2. Supervised warm start (part of the recipe, when the task names a target field): train on the task's
   training split until held-out accuracy reaches ``sft.stop_accuracy`` (<= 0.5). That policy is version 0.
3. RL steps: wait for ``rollout.batch_size`` accepted groups (episodes of the workflow, admitted under the staleness
   bound eta), recompute proximal logprobs, compute advantages, one decoupled-PPO update per minibatch,
   publish version v+1 in HF format, pause -> load -> continue every server (interrupted samples resume with
   their prefix; the servers load while the trainer takes its next batch, and the load is awaited before the
   next publish and before an eval), measure held-out accuracy, append one line to ``metrics.jsonl``.

For ``areal bench throughput`` (off by default, output unchanged): ``record_timeline=True`` writes
``timeline.json`` (:class:`~areal_cli.foundations.timeline.Timeline`); ``parallel.trainer_cpus`` / ``parallel.server_cpus`` /
``parallel.controller_cpus`` pin the trainer thread, the servers, and the rest of this process (controller, reward
workers) to chosen cores; ``rollout.interruptible: false`` makes weight updates wait for in-flight samples instead of
aborting them, and ``rollout.pause_mode: in_place`` makes them pause the servers in place (in-flight samples keep
their KV cache and decode on with the new weights: nothing is aborted or re-prefilled).

Modules:
    run:         the entry points (:func:`run_training`, :func:`resume_training`, :func:`steps_for_epochs`) and
                 the checks before anything is written (:func:`preflight`).
    setup:       starting and stopping everything a run needs around the two phases (:func:`~.setup.run_job`).
    context:     :class:`~.context.RunContext`, what a running job holds.
    warm_start:  phase 1, the supervised warm start.
    loop:        phase 2, the asynchronous RL loop (:func:`~.loop.rl_loop`) and its per-step metrics.
    evaluation:  held-out accuracy.
    weights:     publishing a policy version to the servers.
    resume:      the run's part of a checkpoint, and restoring it.
    checkpoint:  checkpoints on disk (atomic, verified), the prompt stream's position, RNG state.
    processes:   the run's child processes: rollout servers and the trainer group.
    run_status:  the live status panel and the final summary's paths.
    tracking:    TensorBoard and Weights & Biases.
"""

__all__ = ["preflight", "resume_training", "run_training", "steps_for_epochs"]


def __getattr__(name: str):
    """The entry points, imported on first use: the modules beside the loop (checkpoint, run_status, tracking,
    processes) are imported by trainer ranks and by evaluation without pulling in the whole loop."""
    if name in __all__:
        import areal_cli.train_loop.run as run

        return getattr(run, name)
    raise AttributeError(f"module 'areal_cli.train_loop' has no attribute {name!r}")
