"""What a checkpoint holds of the run beyond the trainer: its config, its weights folder, and the rollout controller's
counters and data position, saved every ``loop.checkpoint_every`` steps and restored by ``areal train --resume``
(semantics: :mod:`areal_cli.train_loop.checkpoint`).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from dataclasses import fields
from pathlib import Path


from areal_cli.train_loop.checkpoint import CRITIC_FILE, Checkpoint, PromptStream, staleness_capacity
from areal_cli.config import TrainConfig
from areal_cli.foundations.errors import UserError
from areal_cli.rollout.controller import RolloutController


def config_of_checkpoint(ckpt: Checkpoint) -> TrainConfig:
    """The run's TrainConfig as stored in the (checksummed) checkpoint state."""
    stored = ckpt.state.get("config")
    where = ckpt.path / "state.json"
    if not isinstance(stored, dict):
        raise UserError(f"{where}: field 'config': missing")
    try:
        cfg = TrainConfig.from_dict(stored, f"{where}: config", note=False)  # not a file the user edits
    except UserError as e:
        raise UserError(f"{e} (written by another version?)") from None
    cfg.validate(str(where))
    return cfg


def restore_weights_dir(out: Path, ckpt: Checkpoint) -> Path:
    """Put the checkpoint's weights at ``out/weights/v<version>`` (what the loop expects) and drop weight
    directories of later versions (those steps are redone). Returns the directory."""
    version = int(ckpt.state["version"])
    wdir = out / "weights"
    for p in wdir.glob("v*"):
        if p.name[1:].isdigit() and int(p.name[1:]) > version:
            shutil.rmtree(p, ignore_errors=True)
    dst = wdir / f"v{version}"
    tmp = wdir / f".v{version}.restore-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(ckpt.hf_dir, tmp)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    return dst


def controller_state(controller: RolloutController, stream: PromptStream, cfg: TrainConfig, step: int) -> dict:
    """The controller's part of a checkpoint, read in one go (no await): staleness counters and their
    capacity, controller counters, data position (:class:`PromptStream`)."""
    counters = controller.staleness.state_dict()
    return {
        "staleness": counters,
        "staleness_capacity": staleness_capacity(cfg.rollout.max_head_offpolicyness, cfg.rollout.batch_size, counters),
        "trained_groups": step * cfg.rollout.batch_size,
        "controller": {f.name: getattr(controller.stats, f.name) for f in fields(controller.stats)},
        "data": stream.position(controller.pending_group_ids()),
    }


def restore_controller(controller: RolloutController, cfg: TrainConfig, ckpt: Checkpoint, dropped_lines: int) -> dict:
    """Set the staleness and controller counters of a resumed run (before the controller starts).

    Staleness: version = the checkpoint's, accepted = groups trained, running = 0, rejected kept; the
    pending groups are re-admitted first, after which the capacity equals the checkpoint's (see
    :mod:`areal_cli.train_loop.checkpoint`). Returns the record of this resume (also in summary.json ``resumes``).
    """
    rs = ckpt.state
    sm = controller.staleness
    sm.set_version(int(rs["staleness"]["version"]))
    sm.accepted, sm.running, sm.rejected = int(rs["trained_groups"]), 0, int(rs["staleness"]["rejected"])
    for name, value in rs["controller"].items():
        setattr(controller.stats, name, Counter(value) if name == "reward_status" else value)
    restored = sm.state_dict()
    n_pending = len(rs["data"]["pending"])
    eta, b = cfg.rollout.max_head_offpolicyness, cfg.rollout.batch_size
    return {
        "checkpoint": str(ckpt.path.relative_to(ckpt.path.parent.parent)), "step": ckpt.step,
        "metrics_lines_dropped": dropped_lines, "pending_reissued": n_pending,
        "staleness_checkpoint": rs["staleness"], "staleness_restored": restored,
        "capacity_checkpoint": rs["staleness_capacity"],
        "capacity_restored": staleness_capacity(eta, b, restored),
        "capacity_after_readmission": staleness_capacity(eta, b, {**restored, "running": n_pending}),
    }


async def setup_reference(ctx, resumed: bool) -> None:
    """Freeze the KL reference on the trainer (``ppo.kl_ctl > 0``; :mod:`areal_cli.trainer.kl`); nothing otherwise.

    A new run's reference is the trainer's weights now (after the warm start), also written to
    ``<run>/reference`` when the run checkpoints (``loop.checkpoint_every``); a resumed run reloads it from there.

    Args:
        ctx: the :class:`~areal_cli.train_loop.context.RunContext`. resumed: the run continues from a checkpoint.
    Raises:
        UserError: a resumed run whose reference weights folder is missing.
    """
    from areal_cli.trainer.kl import REFERENCE_DIR

    if not ctx.cfg.ppo.kl_ctl > 0:
        return
    ref_dir = ctx.out / REFERENCE_DIR
    if resumed:
        if not (ref_dir / "config.json").is_file():
            raise UserError(f"{ref_dir}: the KL reference weights (ppo.kl_ctl={ctx.cfg.ppo.kl_ctl}) of this run are "
                            f"missing, so the reference (the run's initial policy) cannot be restored; the run "
                            f"cannot be resumed with ppo.kl_ctl > 0")
        await ctx.train("areal_cli.trainer.kl:freeze_reference", ref_dir)
    else:
        await ctx.train("areal_cli.trainer.kl:freeze_reference", None,
                        ref_dir if ctx.cfg.loop.checkpoint_every else None)


async def setup_critic(ctx, resume) -> None:
    """Build the critic on the trainer (``critic.enabled``; :mod:`areal_cli.trainer.critic`); nothing otherwise.

    A new run's critic starts from the run's initial model with a zero value head; a resumed run loads the
    checkpoint's :data:`~areal_cli.train_loop.checkpoint.CRITIC_FILE` (weights and AdamW state).

    Args:
        ctx: the :class:`~areal_cli.train_loop.context.RunContext`. resume: the :class:`Checkpoint` or None.
    Raises:
        UserError: a resumed run whose checkpoint has no critic.
    """
    c = ctx.cfg.critic
    if not c.enabled:
        return
    state_file = None
    if resume is not None:
        state_file = resume.path / CRITIC_FILE
        if not state_file.is_file():
            raise UserError(f"{state_file}: missing: this checkpoint was written without a critic, so a run with "
                            f"critic.enabled true cannot resume from it")
    await ctx.train("areal_cli.trainer.critic:attach_critic", lr=c.lr or ctx.cfg.ppo.lr,
                    weight_decay=c.weight_decay, grad_clip=c.grad_clip, seed=ctx.cfg.seed,
                    state_file=str(state_file) if state_file else None)
