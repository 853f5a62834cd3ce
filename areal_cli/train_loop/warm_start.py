"""Phase 1 of a run: the supervised warm start (SFT on the task's training split until held-out accuracy reaches
``sft.stop_accuracy``, rolled back one evaluation interval if it overshoots 0.5). That policy is version 0.
"""

from __future__ import annotations

import shutil
import time


from areal_cli.foundations.errors import UserError
from areal_cli.train_loop.context import STEPS, RunContext
from areal_cli.train_loop.evaluation import evaluate
from areal_cli.train_loop.weights import publish


async def warm_start(ctx: RunContext) -> dict:
    """Supervised warm start: the SFT stage (:class:`areal_cli.sft.stage.SftStage`, recipe keys ``sft_*``) on the
    task's training split, until held-out accuracy reaches ``sft.stop_accuracy``; rolls back one eval
    interval if accuracy overshoots 0.5.

    Loss: mean negative log-likelihood over response tokens only (prompt tokens masked), sequences packed
    (:mod:`areal_cli.sft.stage`).
    Returns:
        {"steps", "accuracy", "seconds"} of the warm start.
    Raises:
        UserError: the ``sft_*`` keys do not fit the examples (fewer examples than a batch, a sequence longer
            than ``sft.max_tokens_per_mb`` or ``sft.pack_row_tokens``).
    """
    from areal_cli.sft.stage import SftConfig, SftStage

    cfg = ctx.cfg
    t_start = time.monotonic()
    acc = await evaluate(ctx)
    ctx.status.phase("warm start", step=0, acc=acc)
    step, kept_state, kept_step = 0, None, 0
    def below(a: float | None) -> bool:  # no held-out set: the warm start runs all sft.max_steps
        return a is None or a < cfg.sft.stop_accuracy

    if cfg.sft.max_steps > 0 and below(acc):
        examples = ctx.task.sft_examples(cfg.sft.n_examples)
        eos = ctx.tokenizer.eos_token_id
        encoded = [(item.prompt_ids, ctx.tokenizer.encode(target, add_special_tokens=False) + [eos])
                   for item, target in examples]
        sft_cfg = SftConfig.from_train_config(cfg)
        try:  # checked here (the stage itself lives in the trainer)
            SftStage(None, encoded, sft_cfg, pad_id=ctx.tokenizer.pad_token_id)
        except ValueError as e:
            field = "sft.batch_size" if "batch" in str(e) else "sft.max_tokens_per_mb"
            raise UserError(f"{cfg.recipe}: field '{field}': the warm start has {len(encoded)} example(s) "
                            f"(sft.n_examples={cfg.sft.n_examples}): {e}") from None
        await ctx.train(f"{STEPS}:sft_begin", encoded, sft_cfg, ctx.tokenizer.pad_token_id)
    while step < cfg.sft.max_steps and below(acc):
        # weights evaluated below the stop accuracy: where to roll back to if the next eval overshoots 0.5
        await ctx.train(f"{STEPS}:keep_weights")
        kept_state, kept_step = True, step
        for _ in range(min(cfg.sft.eval_every, cfg.sft.max_steps - step)):
            stats = await ctx.train(f"{STEPS}:sft_step")
            step += 1
        await publish(ctx, 0, f"sft-step{step}")
        acc = await evaluate(ctx)
        ctx.status.phase("warm start", step=step, acc=acc, loss=stats["loss"])
    if cfg.sft.max_steps > 0 and kept_state is not None:
        await ctx.train(f"{STEPS}:sft_end", rollback=acc is not None and acc > 0.5)
    if acc is not None and acc > 0.5 and kept_state is not None:
        ctx.status.log(f"warm start overshot ({acc:.3f} > 0.5): rolling back to step {kept_step}")
        step = kept_step
        await publish(ctx, 0, f"sft-step{step}")
        acc = await evaluate(ctx)
    for p in (ctx.out / "weights").glob("sft-step*"):
        if p.name != f"sft-step{step}":
            shutil.rmtree(p, ignore_errors=True)
    return {"steps": step, "accuracy": acc, "seconds": time.monotonic() - t_start}
