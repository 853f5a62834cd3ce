"""Experiment tracking: every metrics line, the evaluation results, the run config and the summary of an
``areal train`` run, sent to TensorBoard and/or Weights & Biases through their own libraries.

``loop.loggers`` (recipe key or ``-o loop.loggers=tensorboard,wandb``) names them, comma-separated. TensorBoard event
files go to ``RUN/tensorboard/`` (``torch.utils.tensorboard.SummaryWriter``; ``tensorboard --logdir RUN``).
W&B runs in the project ``loop.wandb_project`` with the run folder's name; it goes online when the machine is logged
in (``WANDB_API_KEY`` or ``wandb login``), else offline into ``RUN/wandb/`` (``wandb sync`` uploads it later);
``WANDB_MODE`` decides when set.

A resumed run (``areal train --resume``) continues the same TensorBoard log (events after the checkpoint are
purged: TensorBoard then shows exactly the resumed run's metrics.jsonl) and the same W&B run (its id is kept in
``RUN/wandb_run_id``), at the global RL steps. W&B never takes a step back: it drops a step below its current one,
and a killed process's offline records can be lost whole (W&B flushes its ``.wandb`` file every 15 s). So the resumed
run first re-logs the checkpoint's metrics lines W&B lacks (online: from the step the server reports, none in the
usual case; offline: every line, a new ``offline-run-*`` folder of the same id that holds the whole history by
itself), then logs each new step W&B can still take: steps of the killed process after the checkpoint that W&B
already has keep the values that process logged (W&B cannot replace them; metrics.jsonl and TensorBoard hold the
redone ones). Steps stay increasing, with no gap and no duplicate.

What is logged per step: every number of the metrics line (booleans as 0/1, nested dicts such as
``loop.eval_benchmarks`` flattened to ``eval_benchmarks/<bench>/<metric>``; text and None are skipped), at the RL step;
and every ``loop.log_samples_every`` steps a table of the samples written to ``samples.jsonl``
(:mod:`areal_cli.train_loop.samples`): TensorBoard text ``samples``, W&B table ``samples``.
Both packages are optional (``pip install 'areal-cli[tracking]'``); a missing one is one line before any work.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any

from areal_cli.foundations.atomic import write_atomic_many
from areal_cli.foundations.errors import UserError

LOGGERS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # logger -> the package it needs


def parse_loggers(spec: str, where: str = "field 'loop.loggers'") -> list[str]:
    """``"tensorboard,wandb"`` -> ``["tensorboard", "wandb"]`` (order kept, duplicates dropped).

    Raises:
        UserError: an unknown logger name, or a logger whose package is not installed (one line each).
    """
    names: list[str] = []
    for part in (p.strip() for p in str(spec or "").split(",")):
        if not part or part in names:
            continue
        if part not in LOGGERS:
            raise UserError(f"{where}: unknown logger {part!r} (known: {', '.join(LOGGERS)})")
        if importlib.util.find_spec(LOGGERS[part]) is None:
            raise UserError(f"{where}: {part} needs the '{LOGGERS[part]}' package, which is not installed "
                            f"(pip install 'areal-cli[tracking]')")
        names.append(part)
    return names


def flatten(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numbers of ``row`` as ``{"a/b": float}``: nested dicts joined with ``/``, bools as 0/1; strings, lists, None
    and non-finite values skipped."""
    out: dict[str, float] = {}
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)) and math.isfinite(v):
            out[key] = float(v)
    return out


class Tracker:
    """The run's loggers (see the module docstring). Every method is a no-op without loggers.

    Args:
        names: from :func:`parse_loggers`.
        out: the run folder.
        config: the run's config (``TrainConfig.to_dict()``).
        project: W&B project.
        resume_step: the checkpoint's RL step when the run is resumed (later TensorBoard events are purged).
        history: with ``resume_step``, the run's metrics lines up to it (re-logged to W&B where it lacks them).
        log: one-line messages (where each logger writes).
    Raises:
        UserError: a logger that cannot start (one line).
    """

    def __init__(self, names: list[str], out: Path, config: dict, *, project: str = "areal",
                 resume_step: int | None = None, history: list[dict] | None = None, log=None) -> None:
        log = log or (lambda message: None)
        self.names = list(names)
        self._tb = None
        self._wandb = None
        self._wandb_next = 0  # the lowest step W&B still takes (it drops lower ones)
        if "tensorboard" in self.names:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(out / "tensorboard"),
                                     purge_step=resume_step + 1 if resume_step is not None else None)
            if resume_step is None:
                self._tb.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)
            log(f"TensorBoard: {out / 'tensorboard'} (tensorboard --logdir {out})")
        if "wandb" in self.names:
            self._wandb = _start_wandb(out, config, project, resumed=resume_step is not None)
            offline = self._wandb.settings.mode == "offline" or bool(getattr(self._wandb, "offline", False))
            # online, a resumed run starts after the last step the server holds; an offline run starts empty
            self._wandb_next = start = 0 if offline else int(getattr(self._wandb, "starting_step", 0) or 0)
            replayed = self._replay(history or []) if resume_step is not None else 0
            if offline and resume_step is not None:
                folder = getattr(self._wandb.settings, "sync_dir", None) or f"{out / 'wandb'}/offline-run-*"
                log(f"W&B: offline run {self._wandb.id} resumed in {folder} with steps 0-{resume_step} re-logged "
                    f"from metrics.jsonl ({replayed} lines): it holds the whole history; upload it later with: "
                    f"wandb sync {folder}")
            elif offline:
                log(f"W&B: offline run {self._wandb.id} in {out / 'wandb'} (upload later with: wandb sync "
                    f"{out / 'wandb'}/offline-run-*)")
            else:
                log(f"W&B: {self._wandb.url or self._wandb.id} (project {project})"
                    + (f", resumed at step {start}" if resume_step is not None else "")
                    + (f" ({replayed} lines W&B lacked re-logged from metrics.jsonl)" if replayed else ""))

    def _replay(self, history: list[dict]) -> int:
        """Log to W&B the checkpoint's metrics lines it lacks (steps from :attr:`_wandb_next` on); returns how many."""
        n = 0
        for row in sorted(history, key=lambda r: int(r.get("step", 0))):
            if int(row.get("step", 0)) >= self._wandb_next:
                self._log_wandb(row)
                n += 1
        return n

    def _log_wandb(self, row: dict[str, Any]) -> None:
        """One metrics line to W&B at its step, unless W&B would drop it (a step below its current one)."""
        step = int(row.get("step", 0))
        if self._wandb is None or step < self._wandb_next:
            return
        self._wandb.log(flatten({k: v for k, v in row.items() if k != "step"}), step=step)
        self._wandb_next = step

    def log(self, row: dict[str, Any]) -> None:
        """Log one metrics line at its ``step`` (to W&B unless it would drop the step: see the module docstring)."""
        step = int(row.get("step", 0))
        flat = flatten({k: v for k, v in row.items() if k != "step"})
        if self._tb is not None:
            for k, v in flat.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        self._log_wandb(row)

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        """Show the samples logged at RL ``step`` (:mod:`areal_cli.train_loop.samples`) as a table: TensorBoard
        text ``samples`` (a Markdown table per step), W&B ``samples`` (a ``wandb.Table``, unless W&B would drop
        the step)."""
        if not records:
            return
        from areal_cli.train_loop.samples import FIELDS, markdown_table

        if self._tb is not None:
            self._tb.add_text("samples", markdown_table(records), int(step))
            self._tb.flush()
        if self._wandb is not None and int(step) >= self._wandb_next:
            import wandb

            table = wandb.Table(columns=list(FIELDS), data=[[r.get(c) for c in FIELDS] for r in records])
            self._wandb.log({"samples": table}, step=int(step))
            self._wandb_next = int(step)

    def summary(self, summary: dict[str, Any]) -> None:
        """Record the run's summary (final accuracy, time to target, controller counters)."""
        flat = flatten(summary)
        if self._tb is not None:
            self._tb.add_text("summary", "```\n" + json.dumps(summary, indent=2, default=str) + "\n```",
                              int(summary.get("final_version", 0) or 0))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.summary.update(flat)

    def close(self) -> None:
        """Flush and close every logger (idempotent)."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_logged_in() -> bool:
    """``WANDB_API_KEY`` set, or a ``~/.netrc`` entry for api.wandb.ai (what ``wandb login`` writes)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc

    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _start_wandb(out: Path, config: dict, project: str, *, resumed: bool):
    import wandb

    id_file = out / "wandb_run_id"
    run_id = id_file.read_text().strip() if resumed and id_file.is_file() else None
    mode = os.environ.get("WANDB_MODE")
    if not mode:
        mode = "online" if _wandb_logged_in() else "offline"
    try:
        run = wandb.init(project=project, name=out.name, dir=str(out), config=config, id=run_id,
                         resume="allow" if run_id else None, mode=mode,
                         settings=wandb.Settings(silent=True, console="off"))
    except Exception as e:  # noqa: BLE001 -- wandb raises many types; the user needs one line
        raise UserError(f"field 'loop.loggers': wandb could not start ({type(e).__name__}: {e}); "
                        f"WANDB_MODE=offline logs without a network") from None
    if run_id is None:
        write_atomic_many({id_file: run.id + "\n"})
    return run
