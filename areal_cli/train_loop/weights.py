"""Publishing a policy version: the trainer's weights saved in HF format (or broadcast, ``rollout.weight_update_mode: xccl``)
and loaded on every server, under the lock that keeps weight updates and server restarts apart.
"""

from __future__ import annotations

import contextlib
from pathlib import Path


from areal_cli.processes import weight_sync_spec
from areal_cli.rollout.controller import RolloutController
from areal_cli.train_loop.context import RunContext


async def load_version(ctx: RunContext, controller: RolloutController, path: Path, version: int) -> None:
    """Load published weights on every server, then let the controller admit rollouts of ``version``."""
    async with fleet_lock(ctx):
        await ctx.client.update_weights_from_disk(str(path.resolve()), version)
        ctx.version, ctx.served = version, (path, version)
    controller.notify_version(version)


def fleet_lock(ctx: RunContext):
    """The lock that keeps weight updates and server restarts apart (a no-op context without supervision)."""
    return ctx.fleet_lock if ctx.fleet_lock is not None else contextlib.nullcontext()


async def sync_distributed(ctx: RunContext, version: int) -> None:
    """``rollout.weight_update_mode: xccl``: every trainer rank gathers the HF weights, rank 0 broadcasts them to the
    servers in buckets (:func:`areal_cli.rollout.weight_sync.sync_weights_from_engine`), around a pause of the
    servers (interruptible) or a hold of new submissions (non-interruptible)."""
    from areal_cli.rollout.weight_sync import update_weights_distributed

    spec = weight_sync_spec(ctx.cfg, ctx.client)
    async with fleet_lock(ctx):
        await update_weights_distributed(
            ctx.client, lambda: ctx.train("areal_cli.rollout.weight_sync:sync_weights_from_engine", spec, version),
            version)


async def publish(ctx: RunContext, version: int, tag: str) -> Path:
    """Write the trainer's weights in HF format and load them on every server as ``version``."""
    path = await ctx.train("engine.save_hf", ctx.out / "weights" / tag)
    async with fleet_lock(ctx):
        await ctx.client.update_weights_from_disk(str(path.resolve()), version)
        ctx.version, ctx.served = version, (path, version)
    return path
