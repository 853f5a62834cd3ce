"""The entry points of ``areal train``: a new run (:func:`run_training`), a resumed one (:func:`resume_training`), and
the RL steps of ``loop.epochs`` passes (:func:`steps_for_epochs`). Everything is checked before anything is written.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
from pathlib import Path

import torch

from areal_cli.foundations.atomic import write_json_atomic
from areal_cli.train_loop.checkpoint import Checkpoint, load_checkpoint, metrics_up_to, truncate_metrics
from areal_cli.config import TrainConfig
from areal_cli.foundations.errors import UserError
from areal_cli.train_loop.processes import check_cpus
from areal_cli.train_loop.run_status import RunStatus
from areal_cli.tasks.task import Task
from areal_cli.foundations.timeline import Timeline
from areal_cli.train_loop.loop import FilterStarved
from areal_cli.train_loop.resume import config_of_checkpoint
from areal_cli.train_loop.setup import run_job


def prepare_out_dir(out: Path) -> None:
    """Refuse to write over an earlier run, finished or interrupted (nothing is overwritten).

    Raises:
        UserError: ``out`` is a file, cannot be created, or already holds a run (config.json is written
            first thing, so an interrupted run counts too).
    """
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: --out exists and is not a directory")
    for marker in ("metrics.jsonl", "config.json"):
        if (out / marker).exists():
            raise UserError(f"{out}: already holds a run ({marker}); choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot create the run directory: {e.strerror}") from None


def preflight(cfg: TrainConfig, *, resume: Checkpoint | None = None) -> Path | None:
    """What :func:`run_training` checks before it writes anything: the model (a directory with config.json or a
    .gguf file, of a supported family), the rollout engine's package, a model for a non-embedded engine, the pinned
    cpus and the loggers' packages. ``areal bench`` calls it in ``--dry-run`` and before its warm start, so that a
    run that cannot start here fails at once with the run's own message.

    Returns:
        the model directory (a .gguf file dequantised into its cache), or None for the embedded tiny model.
    Raises:
        UserError: one line naming the setting (``model.path``, ``rollout.engine``, ``parallel.*_cpus``, ``loop.loggers``).
    """
    model_dir = None
    if cfg.model.path is not None:
        from areal_cli.models.gguf import resolve_model
        from areal_cli.rollout.engine import ModelSpec

        from areal_cli.models.packaged import locate_model

        if not locate_model(cfg.model.path).exists():
            raise UserError(f"model.path '{cfg.model.path}': no such file or directory (a published model: `areal "
                            f"download MODEL_REPO_ID --local-dir DIR`, then -o model.path=DIR)")
        model_dir = resolve_model(cfg.model.path, log=print)  # a .gguf file: dequantised once into a cache
        if not (model_dir / "config.json").is_file():
            raise UserError(f"model.path '{cfg.model.path}': not a model directory (no config.json) or .gguf file")
        ModelSpec.from_model_dir(model_dir)  # an unsupported family or feature: one line, before anything
    if cfg.rollout.engine == "sglang":
        from areal_cli.rollout.sglang_env import check_python, resolve_sglang_python

        if cfg.rollout.sglang_python and not Path(cfg.rollout.sglang_python).expanduser().is_absolute():
            # kept in the run's config.json: a relative path must still name it from wherever --resume runs
            cfg.rollout.sglang_python = os.path.abspath(os.path.expanduser(cfg.rollout.sglang_python))
        check_python(resolve_sglang_python(cfg.rollout.sglang_python), full=False)
    if cfg.model.path is None and cfg.rollout.engine == "external" and resume is None:
        # (launched SGLang servers serve the tiny model the run builds, as embedded ones do)
        raise UserError(f"field 'model.path': rollout.engine {cfg.rollout.engine} serves a model directory; set "
                        f"-o model.path=DIR (a published recipe's base model: `areal download {cfg.recipe} "
                        f"--local-dir DIR`, then -o model.path=DIR/model -o task.dataset=DIR/data/FILE)")
    check_cpus(cfg)
    from areal_cli.train_loop.tracking import parse_loggers

    parse_loggers(cfg.loop.loggers)  # a missing package: one line, before any work
    return model_dir


def run_training(cfg: TrainConfig, out: Path, *, live: bool = True, record_timeline: bool = False,
                 resume: Checkpoint | None = None) -> dict:
    """Run warm start + asynchronous RL for ``cfg``; return the summary (also written to summary.json).

    Args:
        record_timeline: also write ``timeline.json`` (:class:`~areal_cli.foundations.timeline.Timeline`).
        resume: continue the run in ``out`` from this verified checkpoint (see :func:`resume_training`).
    Raises:
        UserError: bad task (unknown preset, unreadable or malformed records, user code that does not load),
            existing run directory, bad model path, or unavailable pinned cpus -- all before anything is written.
        FilterStarved: the success-rate filter dropped every group of ``rollout.filter_patience_batches`` batches'
            worth; raised after summary.json (``"ok": false``, ``"stopped"``), metrics.jsonl and the curve are written.
    """
    model_dir = preflight(cfg, resume=resume)
    from areal_cli.train_loop.tracking import Tracker, parse_loggers

    loggers = parse_loggers(cfg.loop.loggers)
    if resume is not None and record_timeline:
        raise UserError("a resumed run cannot record a timeline (areal bench runs are not resumed)")
    task = Task(cfg)
    if cfg.loop.epochs and resume is None:
        cfg = cfg.with_values({"loop.max_steps": steps_for_epochs(cfg, task)})
    created = not out.exists()
    if resume is None:
        prepare_out_dir(out)
    torch.set_num_threads(cfg.parallel.torch_threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if resume is None:
        write_json_atomic(out / "config.json", cfg.to_dict())
    status = RunStatus(cfg, out, live=live)
    timeline = Timeline() if record_timeline else None
    tracker = None
    try:
        tracker = Tracker(loggers, out, cfg.to_dict(), project=cfg.loop.wandb_project,
                          resume_step=resume.step if resume is not None else None,
                          history=metrics_up_to(out / "metrics.jsonl", resume.step) if resume is not None else None,
                          log=status.log)
        with status:
            summary = asyncio.run(run_job(cfg, out, task, status, timeline, resume, model_dir, tracker))
        tracker.summary(summary)
    except UserError as e:
        # bad input found before the first RL step ended (a prompt the tokenizer cannot take, a workflow or reward
        # that breaks at once, a micro-batch budget too small, ...): nothing worth keeping was made, so leave
        # nothing behind -- a half-made run directory would block the same --out next time
        if resume is None and created and not _has_rl_steps(out / "metrics.jsonl"):
            logs = out / "logs"
            if logs.is_dir() and str(logs) in str(e):  # e.g. a server that failed to start: its log is the clue
                import tempfile

                kept = Path(tempfile.mkdtemp(prefix="areal-failed-run-logs-"))
                shutil.move(str(logs), str(kept / "logs"))
                shutil.rmtree(out, ignore_errors=True)
                raise type(e)(str(e).replace(str(logs), str(kept / "logs"))) from None
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        if tracker is not None:
            tracker.close()
    if summary.get("stopped"):  # the run ended itself (FilterStarved): its folder is complete up to that step
        raise FilterStarved(f"{summary['stopped']} (the run's metrics.jsonl and summary.json are in {out})")
    status.summary(summary)
    return summary


def _has_rl_steps(metrics: Path) -> bool:
    """Whether ``metrics.jsonl`` holds at least one finished RL step."""
    try:
        return any('"phase": "rl"' in line for line in metrics.read_text().splitlines())
    except OSError:
        return False


def steps_for_epochs(cfg: TrainConfig, task: Task) -> int:
    """RL steps of ``cfg.loop.epochs`` passes over the training records: ``epochs * (records // batch_size)``
    (AReaL counts steps per epoch the same way, before any filtering).

    Raises:
        UserError: a generated (endless) dataset, or fewer records than one batch.
    """
    if task.train_records is None:
        raise UserError(f"field 'loop.epochs': task '{task.name}' streams generated records; set loop.max_steps instead")
    per_epoch = len(task.train_records) // cfg.rollout.batch_size
    if per_epoch == 0:
        raise UserError(f"field 'loop.epochs': {len(task.train_records)} training records do not fill one batch of "
                        f"{cfg.rollout.batch_size} prompts")
    return cfg.loop.epochs * per_epoch


def resume_training(path: Path, *, live: bool = True) -> dict:
    """``areal train --resume PATH``: continue a run killed or stopped after a checkpoint.

    ``PATH`` is the run directory (its newest checkpoint is used) or one ``checkpoints/step-*`` directory.
    The configuration is the one stored in the checkpoint. Everything is verified before anything is
    written; see :mod:`areal_cli.train_loop.checkpoint` for what is restored and what is regenerated.
    Raises:
        UserError: no checkpoint, a corrupted one (naming the file), a finished run, a missing base model.
    """
    ckpt = load_checkpoint(path)
    run_dir = ckpt.path.parent.parent
    if (run_dir / "summary.json").exists():
        raise UserError(f"{run_dir}: the run already finished (summary.json); nothing to resume")
    cfg = config_of_checkpoint(ckpt)
    truncate_metrics(run_dir / "metrics.jsonl", ckpt.step, write=False)  # checked now, cut when the run restarts
    if cfg.model.path is None and not (run_dir / "model" / "base" / "config.json").is_file():
        raise UserError(f"{run_dir / 'model' / 'base'}: the run's base model is missing; cannot resume")
    return run_training(cfg, run_dir, live=live, resume=ckpt)

