"""Multi-node launch on Slurm + torchrun (``areal launch slurm`` / ``areal launch node``).

- :mod:`areal_cli.launch.plan`: the launch plan (``run_dir/launch/plan.json``): placement, server settings,
  the controller's ``areal train`` command, torchrun's trainer entry, ports.
- :mod:`areal_cli.launch.slurm`: ``run_dir/launch/job.sbatch`` (one ``srun`` task per node running
  ``areal launch node``) and ``sbatch`` submission.
- :mod:`areal_cli.launch.node`: the per-node entry: this node's servers, its torchrun, the controller on
  node 0; discovery through files in the shared run directory; every node stops when one fails.

Why Slurm + torchrun and not Ray: no extra daemon to run and secure (Slurm is what GPU clusters already
schedule with, and AReaL's published runs used it); torchrun is already how the trainer's ranks start on one
machine (:class:`areal_cli.trainer.group.TorchrunTrainer`), so multi-node only adds ``--nnodes/--node-rank/
--master-addr``. See docs/guides/scale-path.md ("Multi-node") for what Ray would change.
"""
