"""Held-out evaluations deferred to after the RL loop (``loop.eval_deferred``), for timing runs.

An evaluation inside the loop stops the trainer for its duration while the rollout side keeps generating under
the staleness bound: an asynchronous run (eta > 0) comes out of every evaluation with up to eta batches
generated in advance, which its next steps consume without waiting, so a run that evaluates often measures a
throughput its steady state does not have (measured on the long-tail benchmark: after the first evaluation the
trainer's wait for a batch dropped from 0.15-0.5 s to 0 for the rest of the run). A synchronous run gains at most
one batch per evaluation. With ``loop.eval_deferred`` the loop only keeps the weights of each step due for an
evaluation (``weights/v{version}``, not deleted two versions later) and, once the rollout controller has stopped,
loads them on the servers in step order and evaluates each (:func:`evaluate_kept`); the accuracies are then
written into ``metrics.jsonl`` and the timeline as if measured in the loop (each line's ``accuracy`` is the latest
measured at its step), with ``eval_deferred: true`` on the evaluated lines. The RL clock never includes an
evaluation.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from areal_cli.foundations.atomic import write_atomic_many
from areal_cli.train_loop.context import RunContext
from areal_cli.train_loop.evaluation import evaluate
from areal_cli.train_loop.weights import load_on_servers


async def evaluate_kept(ctx: RunContext, kept: list[tuple[int, int, Path]]) -> dict[int, tuple[float | None, float]]:
    """Load each kept version on every server and evaluate it: ``kept`` is ``[(step, version, weights dir)]`` in
    step order; returns ``{step: (accuracy, seconds of the evaluation)}``. Nothing else may be generating (the
    rollout controller has stopped). The servers end on the last kept version.

    Raises:
        what :func:`~areal_cli.train_loop.evaluation.evaluate` and the weight load raise.
    """
    out: dict[int, tuple[float | None, float]] = {}
    for step, version, path in kept:
        await load_on_servers(ctx, path, version)
        t = time.monotonic()
        acc = await evaluate(ctx)
        out[step] = (acc, time.monotonic() - t)
        ctx.status.log(f"deferred evaluation of step {step} (version {version}): accuracy "
                       f"{'n/a' if acc is None else f'{acc:.3f}'}")
    return out


def fill_accuracies(rows: list[dict], measured: dict[int, tuple[float | None, float]]) -> list[dict]:
    """The RL rows (metrics lines or timeline steps, each with ``step``) with the deferred accuracies: an evaluated
    step gets ``evaluated``, ``accuracy``, ``eval_deferred`` and ``deferred_eval_s``; every later row carries the
    latest accuracy, as lines measured in the loop do. Rows before the first evaluated step keep theirs (the warm
    start's). Returns new dicts; ``rows`` is not changed."""
    out, latest, seen = [], None, False
    for r in rows:
        r = dict(r)
        step = r.get("step")
        if isinstance(step, int) and step in measured and r.get("phase", "rl") == "rl":
            latest, seen = measured[step][0], True
            r.update({"evaluated": True, "accuracy": latest, "eval_deferred": True,
                      "deferred_eval_s": round(measured[step][1], 4)})
        elif seen and r.get("phase", "rl") == "rl":
            r["accuracy"] = latest
        out.append(r)
    return out


def rewrite_metrics(path: Path, measured: dict[int, tuple[float | None, float]]) -> None:
    """``metrics.jsonl`` with the deferred accuracies filled in (:func:`fill_accuracies`), replaced atomically."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    write_atomic_many({path: "".join(json.dumps(r) + "\n" for r in fill_accuracies(rows, measured))})
