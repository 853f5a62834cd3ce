"""Setting up and tearing down a run: the model and tokenizer, the rollout servers (pinned to their cores), the reward
pool, the trainer group, the rollout client and controller process, the fleet supervisor; then the warm start
and the RL loop inside them (:func:`run_job`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any


from areal_cli.foundations.atomic import write_json_atomic
from areal_cli.train_loop.checkpoint import Checkpoint
from areal_cli.config import TrainConfig
from areal_cli.rollout.from_config import episode_client, open_reward_pool, stop_token_ids
from areal_cli.foundations.errors import UserError
from areal_cli.train_loop.processes import check_cpus, launch_servers, pin_process, start_trainer
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.remote_controller import RolloutProcess, RolloutSpec
from areal_cli.train_loop.run_status import RunStatus
from areal_cli.tasks.task import Task
from areal_cli.foundations.timeline import Timeline
from areal_cli.train_loop.context import RunContext
from areal_cli.train_loop.loop import rl_loop
from areal_cli.train_loop.resume import restore_weights_dir
from areal_cli.train_loop.warm_start import warm_start
from areal_cli.train_loop.weights import adopt_or_reset_external


def sandbox_in_force(cfg: TrainConfig, task: Task, status: RunStatus) -> dict | None:
    """For a code task: apply ``task.sandbox_isolation``, probe the sandbox once, warn in one line when its level is
    below full (recorded in metrics.jsonl's first line and summary.json).

    Raises:
        UserError: the sandbox refuses (``strict`` without every layer, root without a reachable interpreter).
    """
    if task.kind != "code":
        return None
    from areal_cli.sandbox import SandboxError
    from areal_cli.sandbox.status import isolation_in_force, reduced_warning

    try:
        state = isolation_in_force(cfg.task.sandbox_isolation)
    except SandboxError as exc:  # the key is named only when its value is what refused
        where = "field 'task.sandbox_isolation': " if cfg.task.sandbox_isolation == "strict" and "strict" in str(exc) else ""
        raise UserError(f"{where}code sandbox: {exc}") from None
    warning = reduced_warning(state)
    if warning:
        status.warn(warning)
    return state


async def run_job(cfg: TrainConfig, out: Path, task: Task, status: RunStatus, timeline: Timeline | None = None,
                  resume: Checkpoint | None = None, model_dir: Path | None = None, tracker: Any = None) -> dict:
    """Build the model (or use ``model_dir``), start the servers, reward pool, trainer group and rollout client,
    run the warm start (skipped with ``resume``) and the RL loop, stop everything (also on errors), and write
    ``summary.json`` (and ``timeline.json`` with a ``timeline``). Returns the summary.

    Raises:
        UserError: bad held-out set, ``rollout.top_k`` below the vocabulary, a sandbox that refuses; and whatever the
            phases raise.
    """
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer

    t0 = status.t0
    if model_dir is not None:
        base = model_dir
    elif resume is not None:
        base = out / "model" / "base"
    else:
        status.log("building the embedded tiny Qwen3 model and tokenizer")
        base = build_tiny_model(out / "model" / "base", seed=cfg.seed, corpus=task.tokenizer_corpus(),
                                vocab_size=cfg.model.vocab_size, hidden_size=cfg.model.hidden_size,
                                num_layers=cfg.model.num_layers, chat_template=cfg.model.chat_template)
    tokenizer = load_tokenizer(base)
    task.bind(tokenizer)
    eval_items = task.heldout(cfg.loop.eval_n_prompts) if cfg.loop.eval_n_prompts else []
    if cfg.loop.eval_n_prompts and not eval_items:
        if task.dropped_too_long:
            raise UserError(f"field 'task.max_prompt_len': every held-out prompt is longer than {cfg.task.max_prompt_len} tokens "
                            f"(raise it, or loop.eval_n_prompts: 0 for no held-out evaluation)")
        raise UserError(f"field 'loop.eval_n_prompts': task '{task.name}' has no held-out prompt to evaluate "
                        f"(set task.eval_dataset or task.heldout_fraction, or loop.eval_n_prompts: 0)")
    stop_ids = stop_token_ids(base, tokenizer)
    from areal_cli.eval.in_loop import BenchmarkEval

    vocab = json.loads((base / "config.json").read_text()).get("vocab_size")
    if vocab and 1 <= cfg.rollout.top_k < int(vocab):
        raise UserError(f"field 'rollout.top_k': training samples must come from the untruncated policy: with top_k {cfg.rollout.top_k} "
                        f"< the vocabulary ({vocab}) the rollout servers report logprobs of the untruncated "
                        "distribution (as SGLang does), so pi_prox/pi_behav would ignore the truncation; use -1 "
                        "(or a value >= the vocabulary, as AReaL's 1000000)")
    bench = BenchmarkEval.prepare(cfg, tokenizer, base, stop_ids, int(vocab), tiny_model=cfg.model.path is None)
    serve_dir, serve_version = base, 0
    if resume is not None:  # the servers restart with the checkpointed policy version
        serve_version = int(resume.state["version"])
        serve_dir = restore_weights_dir(out, resume)
        status.log(f"resuming from {resume.path} (step {resume.step}, policy version {serve_version})")
    trainer_cpus, server_cpus, controller_cpus = check_cpus(cfg)
    fleet = launch_servers(cfg, serve_dir, serve_version, out, status.log)
    # this process's threads other than the trainer's: the controller's event loop, or, when the controller
    # runs in its own process, the trainer's side (receiving batches, publishing)
    main_cpus = trainer_cpus if (cfg.parallel.rollout_process and trainer_cpus) else controller_cpus
    original_cpus = os.sched_getaffinity(0) if main_cpus else None
    for p in fleet.procs if server_cpus else ():
        pin_process(p.pid, server_cpus)
    if main_cpus:  # every thread of this process; the reward workers inherit it when they start
        pin_process(0, main_cpus)
    pool = None
    client = None
    remote = None
    trainer = None
    supervising: asyncio.Task | None = None
    try:
        sandbox = sandbox_in_force(cfg, task, status)  # before the reward workers start: they inherit the setting
        pool = open_reward_pool(cfg, task)
        engine_kwargs = dict(hf_model_dir=base, lr=cfg.sft.lr, weight_decay=cfg.ppo.weight_decay,
                             betas=(cfg.ppo.adam_beta1, cfg.ppo.adam_beta2), eps=cfg.ppo.adam_eps, grad_clip=cfg.ppo.grad_clip,
                             seed=cfg.seed)
        trainer = await start_trainer(cfg, engine_kwargs, out, trainer_cpus, status.log)
        if resume is not None:
            await trainer.call("areal_cli.train_loop.checkpoint:restore_trainer", resume)
        await asyncio.to_thread(fleet.wait_ready)
        for p in fleet.procs if server_cpus else ():  # again: threads the child started before the first pinning
            pin_process(p.pid, server_cpus)
        urls = list(fleet.urls)
        on_activity = None
        if timeline is not None:
            lanes = {u: f"server{i}" for i, u in enumerate(urls)}
            on_activity = lambda url, kind, a, b: timeline.add(lanes.get(url, url), kind, a, b)  # noqa: E731
        vocab_size = trainer.info["vocab_size"]
        client = RolloutClient(urls, vocab_size=vocab_size,
                               interruptible=cfg.rollout.interruptible,
                               pause_mode=cfg.rollout.pause_mode, on_activity=on_activity)
        if cfg.rollout.engine == "external":  # servers someone else started: at the run's version, or loaded
            await adopt_or_reset_external(client, serve_dir, serve_version, status.log,
                                          in_place=cfg.rollout.interruptible and cfg.rollout.pause_mode == "in_place")
        client.set_weight_version(serve_version)
        if cfg.parallel.rollout_process:  # starts now, builds its controller during the warm start
            remote = RolloutProcess(RolloutSpec(cfg, str(base), urls, vocab_size,
                                                controller_cpus, timeline is not None), on_activity=on_activity)
        episodes = episode_client(cfg, client, pool, tokenizer, task, stop_ids)
        eval_sampling = dataclasses.replace(episodes.sampling, temperature=cfg.loop.eval_temperature)
        eval_episodes = episode_client(cfg, client, pool, tokenizer, task, stop_ids, sampling=eval_sampling,
                                       group_size=cfg.loop.eval_n_samples, rid_prefix="eval-")
        ctx = RunContext(cfg, out, task, tokenizer, trainer, client, fleet, pool, episodes, eval_episodes, eval_items,
                         status, t0, timeline, remote, version=serve_version, bench=bench, tracker=tracker,
                         served=(serve_dir, serve_version))
        ctx.sandbox = sandbox
        if not cfg.parallel.rollout_process:  # the controller's client is this one: heal servers that die
            from areal_cli.rollout.supervisor import FleetSupervisor

            ctx.fleet_lock = asyncio.Lock()
            ctx.supervisor = FleetSupervisor(
                fleet, client, weights_of=lambda: ctx.served, lock=ctx.fleet_lock,
                can_restart=cfg.rollout.weight_update_mode == "disk", max_restarts=cfg.rollout.server_max_restarts,
                stall_s=cfg.rollout.server_stall_timeout_s, log=status.log, clock=lambda: time.monotonic() - t0)
            supervising = ctx.supervisor_task = asyncio.create_task(ctx.supervisor.run())

        async def train() -> dict:
            warm = await warm_start(ctx) if resume is None else resume.state["warm_start"]
            return await rl_loop(ctx, warm, resume)

        summary = await _unless_the_fleet_fails(ctx, train())
        if ctx.supervisor is not None:
            st = ctx.supervisor.stats
            summary["fleet"] = {**ctx.supervisor.metrics(), "restarts_per_server": dict(st.restarts),
                                "events": st.events}
    finally:
        if supervising is not None:
            supervising.cancel()
            await asyncio.gather(supervising, return_exceptions=True)
        if bench is not None:
            bench.close()
        if remote is not None:
            remote.close()
        if client is not None:
            await client.aclose()
        if pool is not None:
            pool.close()
        if trainer is not None and cfg.rollout.weight_update_mode == "xccl":
            with contextlib.suppress(Exception):  # the servers leave the weight-update group
                await trainer.call("areal_cli.rollout.weight_sync:close_engine_senders")
        fleet.stop()
        if trainer is not None:
            trainer.close()
        if original_cpus is not None:
            pin_process(0, frozenset(original_cpus))
    from areal_cli.models.gguf import provenance_of

    if provenance_of(base) is not None:
        summary["model_provenance"] = {"gguf": provenance_of(base), "model_dir": str(base)}
    write_json_atomic(out / "summary.json", summary)
    if timeline is not None:
        timeline.marks["t0"] = t0
        write_json_atomic(out / "timeline.json", timeline.to_dict())
    return summary


async def _unless_the_fleet_fails(ctx: RunContext, work) -> Any:
    """Run ``work`` (the warm start and the RL loop) while the fleet supervisor heals servers; an outage it cannot
    heal cancels ``work`` (its cleanup runs) and is raised: the run ends with that one line, wherever the loop was
    waiting (a batch, a weight load, an evaluation)."""
    task = asyncio.ensure_future(work)
    if ctx.supervisor_task is None:
        return await task
    try:
        await asyncio.wait({task, ctx.supervisor_task}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    ctx.supervisor_task.result()  # raises the outage
    raise RuntimeError("the fleet supervisor stopped without an error")  # unreachable: run() never returns

