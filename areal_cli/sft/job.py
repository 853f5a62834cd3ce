"""A published SFT recipe (``kind: sft``, boba-sft-32b) as a run: AReaL-boba-SFT-200 records (``prompt``,
``answer``) on the trainer group -- one process, or the torchrun ranks of the allocation's data x tensor x
pipeline parallel -- with the recipe's :class:`~areal_cli.sft.stage.SftConfig` (packing, response-only loss,
first-fit-decreasing micro-batches, learning-rate schedule).

Writes ``OUT/sft_metrics.jsonl`` (one line per optimiser step), ``OUT/weights/final`` (HF format) and
``OUT/summary.json``.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Callable

from areal_cli.foundations.atomic import write_json_atomic
from areal_cli.foundations.errors import UserError

STEPS = "areal_cli.trainer.steps"


def run_sft_job(spec: Any, model_dir: str | Path, data_file: str | Path, out: str | Path, *, placement: Any = None,
                max_steps: int | None = None, log: Callable[[str], None] = print) -> dict:
    """Train ``model_dir`` on ``data_file`` with the recipe's ``sft`` section ``spec``.

    Args:
        placement: where the allocation puts the trainer ranks (None: one process).
        max_steps: stop after this many steps (default: the recipe's epochs).
    Returns:
        ``{"steps", "final_loss", "weights", "elapsed_s"}`` (also in ``OUT/summary.json``).
    Raises:
        UserError: unreadable or malformed records (``file:line: field``), an ``out`` that already holds a run,
            sequences that do not fit the micro-batch budget.
    """
    from areal_cli.eval.generate import load_tokenizer
    from areal_cli.sft.stage import SftConfig, SftStage, load_prompt_answer_jsonl

    out = Path(out)
    if (out / "sft_metrics.jsonl").exists():
        raise UserError(f"{out}: already holds an SFT run (sft_metrics.jsonl); choose another --out")
    tokenizer = load_tokenizer(Path(model_dir))
    examples = load_prompt_answer_jsonl(data_file, tokenizer)
    cfg = SftConfig.from_spec(spec)
    if max_steps is not None:
        cfg.max_steps = max_steps
    try:
        SftStage(None, examples, cfg, pad_id=tokenizer.pad_token_id or 0)  # checked before any process starts
    except ValueError as e:
        raise UserError(f"sft: {e}") from None
    return asyncio.run(_run(cfg, Path(model_dir), examples, out, placement, tokenizer.pad_token_id or 0, log))


async def _run(cfg: Any, model_dir: Path, examples: list, out: Path, placement: Any, pad_id: int,
               log: Callable[[str], None]) -> dict:
    from areal_cli.trainer.group import LocalTrainer, TorchrunTrainer

    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    engine_kwargs = {"hf_model_dir": model_dir, **cfg.engine_kwargs()}
    train = placement.allocation.train if placement is not None else None
    world = train.dp * train.tp * train.pp if train is not None else 1
    if world == 1:
        trainer = await LocalTrainer.launch(engine_kwargs)
    else:
        log(f"starting {world} trainer ranks with torchrun (data {train.dp} x tensor {train.tp} x pipeline {train.pp})")
        trainer = await TorchrunTrainer.launch(engine_kwargs, world=world, tp=train.tp, pp=train.pp, run_dir=out)
    try:
        await trainer.call(f"{STEPS}:sft_begin", examples, cfg, pad_id)
        total = cfg.total_steps(len(examples))
        stats: dict = {}
        with open(out / "sft_metrics.jsonl", "w") as fh:
            for step in range(1, total + 1):
                stats = await trainer.call(f"{STEPS}:sft_step")
                fh.write(json.dumps({"step": step, **{k: round(float(v), 6) for k, v in stats.items()},
                                     "elapsed_s": round(time.monotonic() - t0, 3)}) + "\n")
                fh.flush()
                log(f"sft step {step}/{total} loss {stats.get('loss', float('nan')):.4f}")
        weights = await trainer.call("engine.save_hf", out / "weights" / "final")
        await trainer.call(f"{STEPS}:sft_end", rollback=False)
    finally:
        trainer.close()
    summary = {"steps": total, "final_loss": stats.get("loss"), "weights": str(weights),
               "elapsed_s": round(time.monotonic() - t0, 3), "examples": len(examples)}
    write_json_atomic(out / "summary.json", summary)
    return summary
