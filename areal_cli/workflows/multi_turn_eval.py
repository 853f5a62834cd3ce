"""First-try and within-``max_turns`` accuracy of trained weights, through the multi-turn workflow.

``areal train``'s in-loop evaluation gives one number per evaluation (for a multi-turn recipe, the accuracy
within ``max_turns``: :mod:`areal_cli.workflows.multi_turn`, ``eval_export``). This module measures both
numbers of a run's saved weights -- the warm start's (``weights/sft-step<N>``) and the last policy's
(``weights/v<N>``) -- on the run's fixed held-out prompts, greedy, with one embedded rollout server and the
task's reward function called in this process (it must be a pure function, as tiny-arith's is). Weights of a
single-turn run can be measured the same way (``task.workflow_args`` of the multi-turn recipe): its first-try
accuracy is its held-out accuracy.

Run as ``python -m areal_cli.workflows.multi_turn_eval RUN_DIR [RUN_DIR ...] [--workflow-args JSON]``: one
JSON line per run with ``warm_start`` and ``final`` results.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal_cli.workflows.multi_turn import MultiTurnWorkflow, turn_accuracy


class InlineRewards:
    """The reward pool's ``call`` interface, calling the reward in this process (pure, fast rewards only:
    no timeout, no isolation). Exceptions become status ``"error"``, as in the pool."""

    async def call(self, fn: str, *args: Any):
        from areal_cli.api.loading import load_object
        from areal_cli.reward.pool import RewardResult

        try:
            value = load_object(fn, "reward entry point")(*args)
            return RewardResult(float(value[-1] if isinstance(value, tuple) else value), "ok", "", value)
        except Exception as e:  # noqa: BLE001 - a failing reward is a counted status
            return RewardResult(None, "error", f"{type(e).__name__}: {e}")


def final_weights(run_dir: Path) -> tuple[Path, Path]:
    """``(warm-start weights, last policy's weights)`` of an ``areal train`` run directory.

    Raises:
        FileNotFoundError: the run kept no ``weights/sft-step*`` or ``weights/v*`` directory.
    """
    wdir = Path(run_dir) / "weights"
    sft = sorted(wdir.glob("sft-step*"), key=lambda p: int(p.name[len("sft-step"):]))
    ver = sorted((p for p in wdir.glob("v*") if p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
    if not sft or not ver:
        raise FileNotFoundError(f"{wdir}: no sft-step* or v* weights")
    return sft[-1], ver[-1]


def evaluate_weights(model_dirs: Sequence[Path], cfg: Any, *, workflow_args: dict | None = None,
                     n_prompts: int | None = None, max_new_tokens: int | None = None) -> list[dict[str, float]]:
    """:func:`~areal_cli.workflows.multi_turn.turn_accuracy` (greedy) of each weights directory.

    Args:
        model_dirs: Hugging Face directories sharing one tokenizer (the first one's is used).
        cfg: the run's :class:`~areal_cli.config.TrainConfig` (task, held-out prompts, workflow arguments).
        workflow_args: :class:`MultiTurnWorkflow` arguments (default: ``cfg.task.workflow_args``).
        n_prompts: held-out prompts (default ``cfg.loop.eval_n_prompts``).
        max_new_tokens: per-turn budget (default ``cfg.rollout.max_new_tokens``).
    Returns:
        one dict per directory: ``first_try``, ``within_max_turns``, ``mean_turns``, ``n``, ``reward_failures``.
    Raises:
        UserError: bad workflow arguments or task settings.
    """
    from areal_cli.rollout.from_config import stop_token_ids
    from areal_cli.models.tiny import load_tokenizer
    from areal_cli.rollout.client import RolloutClient
    from areal_cli.rollout.episode import EpisodeClient
    from areal_cli.rollout.protocol import SamplingParams
    from areal_cli.rollout.server import EmbeddedServer
    from areal_cli.tasks.task import Task

    dirs = [Path(d).resolve() for d in model_dirs]
    tokenizer = load_tokenizer(dirs[0])
    task = Task(cfg, load_workflow=False).bind(tokenizer)
    items = task.heldout(n_prompts or cfg.loop.eval_n_prompts)
    workflow = MultiTurnWorkflow(**dict(cfg.task.workflow_args if workflow_args is None else workflow_args))
    vocab = json.loads((dirs[0] / "config.json").read_text())["vocab_size"]
    params = SamplingParams(max_new_tokens=max_new_tokens or cfg.rollout.max_new_tokens, temperature=0.0,
                            stop_token_ids=stop_token_ids(dirs[0], tokenizer) or None)

    async def run(url: str) -> list[dict[str, float]]:
        client = RolloutClient([url], vocab_size=int(vocab))
        episodes = EpisodeClient(client, InlineRewards(), task.reward_spec, tokenizer, params, 1,
                                 code_dir=task.code_dir, rid_prefix="mt-eval-")
        out = []
        try:
            for i, d in enumerate(dirs):
                if i:
                    await client.update_weights_from_disk(str(d), i)
                out.append(await turn_accuracy(workflow, episodes, items))
        finally:
            await client.aclose()
        return out

    with EmbeddedServer.launch(dirs[0], max_total_tokens=16384) as srv:
        return asyncio.run(run(srv.url))


def evaluate_run(run_dir: Path, *, workflow_args: dict | None = None, n_prompts: int | None = None
                 ) -> dict[str, Any]:
    """Warm-start and final accuracies of an ``areal train`` run directory (its ``config.json``).

    Returns:
        ``{"run": str, "warm_start": {...}, "final": {...}, "weights": [sft dir name, final dir name]}``.
    """
    from areal_cli.config import TrainConfig

    run_dir = Path(run_dir)
    raw = json.loads((run_dir / "config.json").read_text())
    cfg = TrainConfig.from_dict(raw, str(run_dir / "config.json"))
    sft, last = final_weights(run_dir)
    ws, fin = evaluate_weights([sft, last], cfg, workflow_args=workflow_args, n_prompts=n_prompts)
    return {"run": str(run_dir), "warm_start": ws, "final": fin, "weights": [sft.name, last.name]}


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--workflow-args", default=None, help="JSON object of MultiTurnWorkflow arguments")
    ap.add_argument("--n-prompts", type=int, default=None)
    a = ap.parse_args(argv)
    wa = json.loads(a.workflow_args) if a.workflow_args else None
    for r in a.runs:
        print(json.dumps(evaluate_run(r, workflow_args=wa, n_prompts=a.n_prompts)), flush=True)


if __name__ == "__main__":
    main()
