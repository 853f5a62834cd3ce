"""Phase 2 of a run: the asynchronous RL loop, one step top to bottom.

Each step waits for ``rollout.batch_size`` accepted groups, trains on them (proximal logprobs, advantages, one
decoupled-PPO update per minibatch), publishes version v+1 (the servers load it while the trainer takes its next
batch), measures held-out accuracy when due, and appends one line to ``metrics.jsonl`` (and, for ``areal bench
throughput``, one step to the :class:`~areal_cli.foundations.timeline.Timeline`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any


from areal_cli.api.types import Group
from areal_cli.train_loop.checkpoint import Checkpoint, PromptStream, capture_rng, restore_rng, truncate_metrics
from areal_cli.rollout.from_config import make_controller
from areal_cli.foundations.errors import UserError
from areal_cli.rollout.protocol import ServerError
from areal_cli.foundations.timeline import cpu_snapshot
from areal_cli.trainer.group import TorchrunTrainer
from areal_cli.train_loop.context import STEPS, RunContext
from areal_cli.train_loop.evaluation import evaluate
from areal_cli.train_loop.resume import controller_state, restore_controller, setup_critic, setup_reference
from areal_cli.train_loop.samples import SAMPLES_FILE, cut_samples, due, pick_samples, write_samples
from areal_cli.train_loop.weights import VersionLoader, sync_distributed
from areal_cli.workflows.multi_turn import turn_keys, turn_metrics


def _rounded(key: str, value):
    """A trainer statistic for metrics.jsonl: 6 decimals, but 4 significant digits for the logprob mismatch
    (~1e-6 nats, which 6 decimals would erase); None and bools as they are."""
    if value is None or isinstance(value, bool):
        return value
    if key.startswith("logprob_mismatch_") and key != "logprob_mismatch_tokens":
        return float(f"{value:.4g}")
    return round(value, 6)


async def _step_costs(ctx: RunContext) -> dict:
    """Each server's engine step-cost sums (:mod:`areal_cli.rollout.engine.step_costs`), by timeline lane
    (``server0``...); a server that does not answer within 5 s or does not report them is left out."""
    out = {}
    for i, url in enumerate(ctx.client.urls):
        try:
            info = await asyncio.wait_for(ctx.client.server_info(url), 5.0)
            costs = info["internal_states"][0]["step_costs"]
        except (ServerError, asyncio.TimeoutError, KeyError, IndexError, TypeError):
            continue
        out[f"server{i}"] = costs
    return out


def _cpu_snapshot(ctx: RunContext) -> dict:
    """CPU seconds of this process, the trainer ranks, the rollout process and the servers (timeline)."""
    return cpu_snapshot(trainer_pids=list(ctx.trainer.pids) if isinstance(ctx.trainer, TorchrunTrainer) else [],
                        rollout_pid=ctx.rollout_process.pid if ctx.rollout_process is not None else None,
                        server_pids=[p.pid for p in ctx.fleet.procs])


async def rl_loop(ctx: RunContext, warm: dict, resume: Checkpoint | None = None) -> dict:
    """Asynchronous RL until ``loop.max_steps``, the target accuracy or the time limit.

    Every ``loop.checkpoint_every`` steps a checkpoint (:func:`~areal_cli.train_loop.checkpoint.save_trainer_checkpoint`) is written after the step's
    metrics line. With ``resume``, the loop continues after the checkpointed step: weights and optimizer are
    already restored (:func:`~areal_cli.train_loop.setup.run_job`); here the data position, staleness
    counters, controller counters and RNG states are, ``metrics.jsonl`` is cut back to the checkpointed step,
    and the next line carries ``"resumed_from"`` (semantics: :mod:`areal_cli.train_loop.checkpoint`). Published versions load
    on the servers in the background, the newest winning (:class:`~areal_cli.train_loop.weights.VersionLoader`);
    the loop waits for them only before an evaluation, a checkpoint and at the end. With ``loop.eval_deferred`` the
    held-out evaluations run after the loop (:mod:`areal_cli.train_loop.deferred_eval`). Every
    ``loop.log_samples_every`` steps a few of the step's samples go to ``samples.jsonl`` and the trackers
    (:mod:`areal_cli.train_loop.samples`). A multi-turn workflow's lines also carry ``train_first_try``,
    ``train_within_max_turns`` and ``train_mean_turns`` (the conversations trained on, after the success-rate
    filter) and, on evaluated lines, ``eval_first_try``, ``eval_within_max_turns`` and ``eval_mean_turns`` (the
    held-out conversations) (:func:`turn_metrics`).

    With a :class:`Timeline`, each step adds ``{"step", "start", "end"`` (end = new version published,
    before any eval), ``"tokens"`` (prompt + response tokens of the batch: what the trainer consumed,
    AReaL's ``ppo_actor/n_tokens``), ``"response_tokens"``, ``"n_samples"``, ``"staleness"`` (histogram
    {versions behind at the first token: samples}), ``"wait_s"``, ``"train_s"``, ``"train_cpu_s"``,
    ``"publish_s"``, ``"eval_s"``, ``"evaluated"`` (held-out accuracy measured after this step), ``"accuracy"``
    (latest measured), ``"cpu"`` (CPU seconds at ``end``),
    ``"generated_tokens"`` (all tokens generated since RL start, kept or dropped, at ``end``),
    ``"response_lengths"`` (tokens generated for each trained sample)}; ``marks["step_costs"]`` holds each server's
    engine step-cost sums at ``"rl_start"`` and ``"rl_end"`` (:mod:`areal_cli.rollout.engine.step_costs`).
    """
    cfg = ctx.cfg
    tl = ctx.timeline
    rs = resume.state if resume is not None else None
    stream = PromptStream(ctx.task.train_stream(), lambda item: item, **(rs["data"] if rs else {}))
    if ctx.rollout_process is not None:
        controller = ctx.rollout_process
        await controller.wait_ready()
    else:
        controller = make_controller(cfg, ctx.episodes, ctx.task, stream)
    metrics_path = ctx.out / "metrics.jsonl"
    resumes: list[dict] = list(rs.get("resumes", [])) if rs else []
    costs_at_start = await _step_costs(ctx) if tl is not None else None  # before the RL clock starts
    if rs is None:
        await ctx.train("engine.set_lr", cfg.ppo.lr)
        await ctx.train("engine.optimizer.state.clear")  # fresh AdamW moments for the RL phase
        version, acc, first_step = 0, warm["accuracy"], 1
        time_to_target, trained_tokens, last_tokens = None, 0, 0
        t_rl = time.monotonic()
    else:  # optimizer state and its lr were restored with the weights
        version, acc, first_step = int(rs["version"]), rs["accuracy"], int(rs["step"]) + 1
        time_to_target, trained_tokens, last_tokens = rs["time_to_target"], rs["trained_tokens"], rs["last_tokens"]
        resumes.append(restore_controller(controller, cfg, resume, truncate_metrics(metrics_path, resume.step)))
        cut_samples(ctx.out / SAMPLES_FILE, resume.step)  # the steps after the checkpoint log their samples again
        now = time.monotonic()  # the run's clocks continue from the checkpoint (the downtime is not counted)
        ctx.t0 = ctx.status.t0 = now - rs["elapsed_s"]
        t_rl = now - rs["rl_elapsed_s"]
        restore_rng(resume.load_rng())
        ctx.status.log(f"resumed at step {first_step}: {len(rs['data']['pending'])} pending prompt(s) re-issued "
                       f"(the run's clock goes on from the checkpoint's {rs['elapsed_s']:.1f} s; the downtime is not "
                       f"counted)")
    await setup_reference(ctx, resumed=rs is not None)  # ppo.kl_ctl > 0: the frozen reference
    await setup_critic(ctx, resume)  # critic.enabled: the value model
    if tl is not None:
        tl.marks["rl_start"] = t_rl
        tl.cpu["rl_start"] = _cpu_snapshot(ctx)
        tl.marks["step_costs"] = {"rl_start": costs_at_start}
    last_bench = None  # the latest in-loop benchmark results
    with metrics_path.open("a" if rs else "w") as mf:
        if rs is None:
            first = {"step": 0, "version": 0, "phase": "warm_start_end", "reward_mean": None, "accuracy": acc,
                     "staleness_max": 0, "staleness_mean": 0.0, "elapsed_s": round(ctx.elapsed(), 3),
                     "rl_elapsed_s": 0.0, "warm_start_steps": warm["steps"],
                     "warm_start_s": round(warm["seconds"], 3), "evaluated": True,
                     **turn_keys(ctx.eval_turns, "eval_")}
            if ctx.sandbox is not None:
                first["sandbox_isolation"] = ctx.sandbox["level"]
                first["sandbox_isolation_summary"] = ctx.sandbox["summary"]
            if ctx.bench is not None:
                first["eval_benchmarks"] = last_bench = await ctx.bench.run(ctx.client, ctx.tokenizer, ctx.version)
                first.update({f"{b}/pass@1": round(r["pass@1"], 6) for b, r in first["eval_benchmarks"].items()})
            mf.write(json.dumps(first) + "\n")
            mf.flush()
            if ctx.tracker is not None:
                ctx.tracker.log(first)
            ctx.status.step(first, controller.stats.as_dict())
        controller.start()
        cs0 = controller.stats.as_dict()  # (a rollout process reports its counters once a second)
        watch = FilterWatch(cfg, cs0)  # a success-rate filter that drops every group ends the run
        stopped: str | None = None
        scored = (cs0.get("reward_sum_scored", 0.0), cs0.get("samples_scored", 0))  # before the group filter
        loader = VersionLoader(ctx, controller)  # the servers load published versions in the background
        next_delete = 1  # weights/v{k} below this were deleted
        deferred = cfg.loop.eval_deferred
        kept: list[tuple[int, int, Any]] = []  # loop.eval_deferred: (step, version, weights dir) to evaluate after
        mismatch_warned = False
        try:
            last_t = time.monotonic()
            for step in range(first_step, cfg.loop.max_steps + 1):
                if cfg.ppo.lr_scheduler != "constant" or cfg.ppo.warmup_proportion:
                    from areal_cli.sft.stage import lr_at

                    await ctx.train("engine.set_lr", lr_at(step - 1, cfg.loop.max_steps, cfg.ppo))
                t_wait = time.monotonic()
                try:
                    groups = await get_batch_watched(
                        ctx, controller, step, consumer_version=version if cfg.rollout.stale_groups == "drop" else None,
                        watch=watch)
                except FilterStarved as e:  # the run ends here: the steps so far stay (metrics, curve, summary)
                    stopped = str(e)
                    break
                t_batch = time.monotonic()
                wait_s = t_batch - t_wait
                train_stats = await ctx.train(f"{STEPS}:train_on_groups", groups, cfg,
                                              ctx.tokenizer.pad_token_id, trainer_version=version)
                if train_stats.get("logprob_mismatch_flagged") and not mismatch_warned:
                    mismatch_warned = True
                    ctx.status.warn(f"step {step}: the servers' logprobs differ from the trainer's on tokens of the "
                                    f"same policy version by up to {train_stats['logprob_mismatch_max']:.2e} nats "
                                    f"(> 1e-4 in float32 is a bug: engine and trainer should compute the same model)")
                train_cpu_s = train_stats.pop("cpu_s")
                n_tokens, n_response = int(train_stats.pop("tokens")), int(train_stats.pop("response_tokens"))
                train_s = time.monotonic() - t_batch - train_stats.pop("batch_s")  # the PPO update
                trained_tokens += n_tokens
                samples = [s for g in groups for s in g.samples]
                stale = [version - s.head_version for s in samples if s.head_version >= 0]  # -1: nothing generated
                version += 1
                t_sync = time.monotonic()
                path = ctx.out / "weights" / f"v{version}"
                # the last step: max_steps, or the time limit (the final policy is then evaluated and kept too)
                time_up = bool(cfg.loop.time_limit_s) and ctx.elapsed() > cfg.loop.time_limit_s
                last = step == cfg.loop.max_steps or time_up
                eval_due = bool(cfg.loop.eval_every) and (step % cfg.loop.eval_every == 0 or last)
                keep_copy = last or bool(cfg.loop.checkpoint_every and step % cfg.loop.checkpoint_every == 0) or (
                    deferred and eval_due)
                if cfg.rollout.weight_update_mode == "xccl":  # broadcast from the trainer; servers paused meanwhile
                    await loader.wait()
                    await sync_distributed(ctx, version)
                    ctx.version = version
                    controller.notify_version(version)
                    if keep_copy:  # the final weights and checkpoints still go to disk
                        await ctx.train("engine.save_hf", path)
                else:
                    await ctx.train("engine.save_hf", path)
                    # The servers load it while the trainer goes on with the next batch (already generated
                    # under the staleness bound); rollouts of the new version are admitted once it is loaded.
                    loader.publish(path, version)
                if deferred and eval_due:
                    kept.append((step, version, path))
                    eval_due = False  # evaluated after the loop (areal_cli.train_loop.deferred_eval)
                bench_every = cfg.loop.eval_benchmark_every or cfg.loop.eval_every
                bench_due = ctx.bench is not None and bool(bench_every) and (step % bench_every == 0
                                                                             or last)
                if eval_due or bench_due or last:
                    await loader.wait()
                # weights no server needs any more (older than the served and the loading version, and the
                # previous one), except those kept for a deferred evaluation
                # (xccl: the servers receive each version by broadcast; no weights folder of a version is read back)
                floor = version - 1 if cfg.rollout.weight_update_mode == "xccl" else loader.floor(version - 1)
                for k in range(next_delete, floor):
                    old = ctx.out / "weights" / f"v{k}"
                    if old.exists() and not any(v == k for _, v, _ in kept):
                        shutil.rmtree(old, ignore_errors=True)
                next_delete = max(next_delete, floor)
                t_published = time.monotonic()
                sync_s = t_published - t_sync
                cpu_now = _cpu_snapshot(ctx) if tl is not None else None
                generated_now = controller.stats.tokens_generated
                if eval_due:
                    acc = await evaluate(ctx)
                bench = await ctx.bench.run(ctx.client, ctx.tokenizer, ctx.version) if bench_due else None
                last_bench = bench or last_bench
                now = time.monotonic()
                if tl is not None:
                    for kind, a, b in (("wait", t_wait, t_batch), ("train", t_batch, t_sync),
                                       ("publish", t_sync, t_published), ("eval", t_published, now)):
                        if b > a and (kind != "eval" or eval_due or bench_due):
                            tl.add("trainer", kind, a, b)
                    tl.steps.append({
                        "step": step, "start": round(t_wait, 6), "end": round(t_published, 6),
                        "tokens": n_tokens, "response_tokens": n_response,
                        "n_samples": len(samples), "staleness": dict(sorted(Counter(stale).items())),
                        "wait_s": round(wait_s, 6), "train_s": round(t_sync - t_batch, 6),
                        "train_cpu_s": round(train_cpu_s, 6), "publish_s": round(sync_s, 6),
                        "eval_s": round(now - t_published, 6), "evaluated": eval_due, "accuracy": acc, "cpu": cpu_now,
                        "generated_tokens": generated_now,
                        "response_lengths": [len(s.output_ids) for s in samples],  # the simulator's calibration
                    })
                cs = controller.stats.as_dict()
                now_scored = (cs.get("reward_sum_scored", 0.0), cs.get("samples_scored", 0))
                new_scored = now_scored[1] - scored[1]
                reward_scored = (now_scored[0] - scored[0]) / new_scored if new_scored else None
                scored = now_scored
                line = {
                    "step": step, "version": version, "phase": "rl",
                    "reward_mean": sum(s.reward for s in samples) / len(samples),
                    # every group scored since the last step, before the success-rate filter dropped any
                    "reward_mean_scored": round(reward_scored, 6) if reward_scored is not None else None,
                    "reward_positive_frac": sum(s.reward > 0 for s in samples) / len(samples),
                    "accuracy": acc,
                    "staleness_max": max(stale, default=0), "staleness_mean": sum(stale) / max(len(stale), 1),
                    "elapsed_s": round(ctx.elapsed(), 3), "rl_elapsed_s": round(now - t_rl, 3),
                    "gen_tokens_per_s": (cs["tokens_generated"] - last_tokens) / max(now - last_t, 1e-9),
                    "train_tokens_per_s": trained_tokens / max(now - t_rl, 1e-9),
                    "wait_s": round(wait_s, 4), "train_s": round(train_s, 4), "sync_s": round(sync_s, 4),
                    "groups_dropped": cs["groups_dropped_filter"] + cs["groups_dropped_reward_failure"]
                    + cs.get("groups_dropped_stale", 0),
                    "prompts_dropped_too_long": cs["prompts_dropped_too_long"],
                    "truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
                    **(ctx.supervisor.metrics() if ctx.supervisor is not None else {}),
                    "staleness_hist": {str(k): v for k, v in sorted(Counter(stale).items())},
                    **{k: _rounded(k, v) for k, v in train_stats.items()}, **cs,
                }
                line.update(turn_metrics(groups, "train_"))  # multi-turn: the episodes trained on
                line["evaluated"] = eval_due
                if eval_due:
                    line["eval_reward_failures"] = ctx.eval_failures
                    line.update(turn_keys(ctx.eval_turns, "eval_"))  # multi-turn: the held-out conversations
                if bench is not None:
                    line["eval_benchmarks"] = bench
                    line.update({f"{b}/pass@1": round(r["pass@1"], 6) for b, r in bench.items()})
                if rs is not None and step == first_step:
                    line["resumed_from"] = str(resume.path.relative_to(ctx.out))
                last_tokens, last_t = cs["tokens_generated"], now
                mf.write(json.dumps(line) + "\n")
                mf.flush()
                if ctx.tracker is not None:
                    ctx.tracker.log(line)
                if due(cfg.loop, step):  # samples you can read (areal_cli.train_loop.samples)
                    records = pick_samples(groups, cfg.loop.log_samples_n, ctx.tokenizer, step)
                    write_samples(ctx.out, records)
                    if ctx.tracker is not None:
                        ctx.tracker.log_samples(step, records)
                ctx.status.step(line, cs)
                if cfg.loop.checkpoint_every and step % cfg.loop.checkpoint_every == 0:
                    await loader.wait()  # the servers must hold this version: the staleness counter is v
                    engine_steps = await ctx.train("engine.steps")
                    state = {
                        "step": step, "version": version, "accuracy": acc, "elapsed_s": line["elapsed_s"],
                        "rl_elapsed_s": line["rl_elapsed_s"], "trained_tokens": trained_tokens,
                        "last_tokens": last_tokens, "time_to_target": time_to_target, "warm_start": warm,
                        **controller_state(controller, stream, cfg, step), "engine_steps": engine_steps,
                        "resumes": resumes, "config": cfg.to_dict(),
                    }
                    rng = capture_rng()
                    t_ck = time.monotonic()
                    ck = await ctx.train("areal_cli.train_loop.checkpoint:save_trainer_checkpoint", ctx.out, step, hf_dir=path,
                                         rng=rng, state=state, keep=cfg.loop.keep_checkpoints)
                    ctx.status.log(f"checkpoint {ck.relative_to(ctx.out)} ({time.monotonic() - t_ck:.2f} s)")
                if time_to_target is None and cfg.loop.target_accuracy and acc is not None and acc >= cfg.loop.target_accuracy:
                    time_to_target = {"step": step, "elapsed_s": line["elapsed_s"], "rl_elapsed_s": line["rl_elapsed_s"]}
                    break
                if time_up:
                    ctx.status.log(f"time limit {cfg.loop.time_limit_s}s reached: the policy of step {step} is the final one")
                    break
            await loader.wait()
        finally:
            await loader.cancel()  # after an error or Ctrl-C: a weight update may be running
            if tl is not None:
                tl.marks["rl_end"] = tl.steps[-1]["end"] if tl.steps else time.monotonic()
                tl.cpu["rl_end"] = tl.steps[-1]["cpu"] if tl.steps else _cpu_snapshot(ctx)
                tl.marks["controller"] = controller.stats.as_dict()
                tl.marks.setdefault("step_costs", {})["rl_end"] = await _step_costs(ctx)
            await controller.stop()
            aclose = getattr(ctx.task.workflow, "aclose", None)  # a workflow's own servers (the agent proxy)
            if aclose is not None and asyncio.iscoroutinefunction(aclose):
                try:
                    await aclose()
                except Exception as e:  # noqa: BLE001 - closing must not hide the run's outcome
                    ctx.status.warn(f"workflow aclose failed: {type(e).__name__}: {e}")
            # also after Ctrl-C: the curve of the steps that were completed
            from areal_cli.foundations.plots import plot_learning_curve

            plot_learning_curve(metrics_path, ctx.out / "learning_curve.png", target=cfg.loop.target_accuracy)
    if kept:  # loop.eval_deferred: the controller has stopped; evaluate the kept versions now
        from areal_cli.foundations.plots import plot_learning_curve
        from areal_cli.train_loop.deferred_eval import evaluate_kept, fill_accuracies, rewrite_metrics

        measured = await evaluate_kept(ctx, kept)
        rewrite_metrics(metrics_path, measured)
        if tl is not None:
            tl.steps = fill_accuracies(tl.steps, measured)
        acc = measured[kept[-1][0]][0]
        for _, v, path in kept:  # evaluated: keep only what a run without deferral keeps (the last two versions)
            if v < version - 1:
                shutil.rmtree(path, ignore_errors=True)
        plot_learning_curve(metrics_path, ctx.out / "learning_curve.png", target=cfg.loop.target_accuracy)
    final = ctx.out / "weights" / f"v{version}"
    if version == 0:  # no RL step: the policy is what the servers started from or were given by the warm start
        final = ctx.served[0] if ctx.served is not None else Path(ctx.fleet.spec.model_path or final)
    summary = {
        "recipe": cfg.recipe, "ok": stopped is None, "final_version": version, "final_accuracy": acc,
        "target_accuracy": cfg.loop.target_accuracy, "target_reached": time_to_target is not None,
        "warm_start": warm, "time_to_target": time_to_target, "elapsed_s": round(ctx.elapsed(), 3),
        "final_weights": str(final), "controller": controller.stats.as_dict(),
        "reward_failures": controller.stats.reward_failure_examples, "task": ctx.task.name,
    }
    if ctx.task.dataset and getattr(ctx.task, "heldout_records", None):  # one's own task read from files
        from areal_cli.eval.heldout_task import heldout_eval_command

        # the one command that evaluates the final weights on the held-out records (written as a task file)
        summary["eval_command"], why_not = heldout_eval_command(ctx.task, cfg, ctx.out, Path(final))
        if why_not:
            summary["eval_command_missing"] = why_not
    if ctx.bench is not None:
        summary["eval_benchmarks"] = ctx.bench.record()
        summary["last_eval_benchmarks"] = last_bench
    if resumes:
        summary["resumes"] = resumes
    if stopped is not None:
        summary["stopped"] = stopped  # run_training raises it (FilterStarved) once summary.json is written
    if ctx.sandbox is not None:
        summary["sandbox_isolation"] = ctx.sandbox
    return summary


class FilterStarved(UserError):
    """The success-rate filter dropped every group of a long stretch (``rollout.filter_patience_batches``): the
    trainer would wait forever for a batch. One line naming the settings and the counts; exit 2."""


class FilterWatch:
    """Counts the groups the success-rate filter has dropped since a group was last accepted, from the controller's
    counters (:meth:`ControllerStats.as_dict`), read while the trainer waits for a batch (:func:`get_batch_watched`).

    Args:
        cfg: the run's TrainConfig (``rollout.filter_patience_batches`` x ``rollout.batch_size`` groups is the
            limit; 0 turns the watch off).
        counters: the counters when the watch starts (a resumed run's are the checkpoint's).
    """

    def __init__(self, cfg: Any, counters: dict) -> None:
        self.cfg = cfg
        self.limit = cfg.rollout.filter_patience_batches * cfg.rollout.batch_size
        self._mark(counters)

    def _mark(self, c: dict) -> None:
        self.accepted = c.get("groups_accepted", 0)
        self.dropped = c.get("groups_dropped_filter", 0)
        self.scored = (c.get("samples_scored", 0), c.get("reward_sum_scored", 0.0))

    def check(self, counters: dict, step: int) -> None:
        """Note the latest counters: a newly accepted group starts the count again.

        Raises:
            FilterStarved: the limit reached with no group accepted since the count started.
        """
        if counters.get("groups_accepted", 0) != self.accepted:
            self._mark(counters)
            return
        in_a_row = counters.get("groups_dropped_filter", 0) - self.dropped
        if self.limit and in_a_row >= self.limit:
            raise FilterStarved(self.message(counters, in_a_row, step))

    def message(self, c: dict, in_a_row: int, step: int) -> str:
        """The one line: the filter's settings, the stretch, the run's group counts, what to change."""
        r = self.cfg.rollout
        samples = c.get("samples_scored", 0) - self.scored[0]
        reward = (c.get("reward_sum_scored", 0.0) - self.scored[1]) / samples if samples else None
        finished = [(c.get("groups_accepted", 0), "accepted", True),
                    (c.get("groups_dropped_filter", 0), "dropped by the filter", True),
                    (c.get("groups_rejected", 0), "rejected by the workflow", False),
                    (c.get("groups_dropped_reward_failure", 0), "dropped by reward failures", False)]
        counts = ", ".join(f"{n} {what}" for n, what, always in finished if n or always)
        return (f"step {step}: the success-rate filter (rollout.success_rate_lb {r.success_rate_lb:g}, "
                f"rollout.success_rate_ub {r.success_rate_ub:g}) dropped the last {in_a_row} groups in a row, none "
                f"accepted (limit: rollout.filter_patience_batches {r.filter_patience_batches} x rollout.batch_size "
                f"{r.batch_size}); groups generated: {sum(n for n, _, _ in finished)} ({counts})"
                + (f"; their samples' mean reward {reward:.3f}" if reward is not None else "")
                + f": every sample of a group agrees (all right or all wrong); a longer warm start (sft.max_steps "
                  f"{self.cfg.sft.max_steps}), a wider success_rate_lb..success_rate_ub range or a larger "
                  f"rollout.group_size ({r.group_size}) gives the trainer batches")


def show_first_reward_failure(ctx: RunContext, controller: Any) -> None:
    """Show the run's first reward failure in the live status as soon as it happens (the record, the exception,
    where it was raised); the run goes on (the group is dropped and counted), and the summary lists the first
    five. A controller in its own process reports its examples when it stops."""
    examples = getattr(controller.stats, "reward_failure_examples", None)
    if examples and not ctx.reward_failure_shown:
        ctx.reward_failure_shown = True
        ctx.status.log(f"first reward failure (its group is dropped and counted; the run goes on): {examples[0]}")


async def get_batch_watched(ctx: RunContext, controller: Any, step: int, every_s: float = 60.0,
                            consumer_version: int | None = None, watch: FilterWatch | None = None,
                            poll_s: float = 0.5) -> list[Group]:
    """``controller.get_batch(batch_size)``, saying once a minute why the wait is long when episodes are being
    dropped or rejected instead of accepted (a success-rate filter that drops every group of a model that
    always or never succeeds starves the trainer, as in AReaL; the counters say so), and ending the wait when the
    filter has dropped every group of a long stretch (``watch``, :class:`FilterWatch`: read every ``poll_s``).

    Raises:
        FilterStarved: see :class:`FilterWatch`.
    """
    task = asyncio.ensure_future(controller.get_batch(ctx.cfg.rollout.batch_size, consumer_version=consumer_version))
    start = dict(controller.stats.as_dict())
    watch = watch if watch is not None else FilterWatch(ctx.cfg, start)
    t0 = time.monotonic()
    next_line = t0 + every_s
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=min(poll_s, every_s))
            if done:
                show_first_reward_failure(ctx, controller)
                return task.result()
            now = controller.stats.as_dict()
            show_first_reward_failure(ctx, controller)
            watch.check(now, step)
            if time.monotonic() < next_line:
                continue
            next_line += every_s
            delta = {k: now.get(k, 0) - start.get(k, 0) for k in ("groups_accepted", "groups_dropped_filter",
                                                                   "groups_rejected", "groups_dropped_reward_failure")}
            ctx.status.log(f"step {step}: waiting {time.monotonic() - t0:.0f} s for a batch of {ctx.cfg.rollout.batch_size} "
                           f"groups: {delta['groups_accepted']} accepted, {delta['groups_dropped_filter']} dropped by "
                           f"the success-rate filter [{ctx.cfg.rollout.success_rate_lb}, {ctx.cfg.rollout.success_rate_ub}], "
                           f"{delta['groups_rejected']} rejected by the workflow, "
                           f"{delta['groups_dropped_reward_failure']} dropped by reward failures"
                           + ("; almost every group is all-correct or all-wrong: a longer warm start (sft.max_steps), "
                              "a wider rollout.success_rate_lb..success_rate_ub range or a larger rollout.group_size gives the trainer "
                              "batches" if delta["groups_dropped_filter"] > 10 * max(delta["groups_accepted"], 1)
                              else ""))
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

