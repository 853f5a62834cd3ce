"""The asynchronous RL loop of ``areal train``, top to bottom.

Processes (DESIGN §3): this process runs the rollout controller (asyncio) and the Megatron-core trainer
(its steps in a worker thread, so rollouts keep streaming while it trains); ``n_servers`` rollout servers
run as child processes (:mod:`areal_cli.processes`); rewards are computed in a worker-process pool. With
``trainer_data_parallel x trainer_tensor_parallel x trainer_pipeline_parallel > 1`` the trainer is a group of
torchrun ranks instead. Every trainer use goes through the group (:mod:`areal_cli.trainer.group`): engine
methods by name and the trainer-side functions of :mod:`areal_cli.trainer.steps`, which run on every rank
with the same arguments.

What is trained is the run's task (:mod:`areal_cli.tasks.task`): records, prompt rendering, reward function
and rollout workflow, each pluggable by ``module:attr`` (:mod:`areal_cli.api`).

1. Read the task's records (bad data fails here, before anything starts), build the embedded tiny model
   (or use ``model_path``), start the servers and the reward pool.
2. Supervised warm start (part of the recipe, when the task names a target field): train on the task's
   training split until held-out accuracy reaches ``sft_stop_accuracy`` (<= 0.5). That policy is version 0.
3. RL steps: wait for ``batch_size`` accepted groups (episodes of the workflow, admitted under the staleness
   bound eta), recompute proximal logprobs, compute advantages, one decoupled-PPO update per minibatch,
   publish version v+1 in HF format, pause -> load -> continue every server (interrupted samples resume with
   their prefix; the servers load while the trainer takes its next batch, and the load is awaited before the
   next publish and before an eval), measure held-out accuracy, append one line to ``metrics.jsonl``.

For ``areal bench throughput`` (off by default, output unchanged): ``record_timeline=True`` writes
``timeline.json`` (:class:`~areal_cli.timeline.Timeline`); ``trainer_cpus`` / ``server_cpus`` /
``controller_cpus`` pin the trainer thread, the servers, and the rest of this process (controller, reward
workers) to chosen cores; ``interruptible: false`` makes weight updates wait for in-flight samples instead of
aborting them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from areal_cli.api.types import Group, Item, RewardFailed, WorkflowError
from areal_cli.atomic import write_json_atomic
from areal_cli.checkpoint import (
    Checkpoint,
    PromptStream,
    capture_rng,
    load_checkpoint,
    restore_rng,
    staleness_capacity,
    truncate_metrics,
)
from areal_cli.config import TrainConfig
from areal_cli.episodes import episode_client, make_controller, open_reward_pool, stop_token_ids
from areal_cli.errors import UserError
from areal_cli.processes import check_cpus, launch_servers, pin_process, start_trainer, weight_sync_spec
from areal_cli.reward.pool import RewardPool
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.controller import RolloutController
from areal_cli.rollout.episode import EpisodeClient
from areal_cli.rollout.fleet import Fleet
from areal_cli.rollout.protocol import ServerError
from areal_cli.rollout.remote_controller import RolloutProcess, RolloutSpec
from areal_cli.run_status import RunStatus
from areal_cli.tasks.task import Task
from areal_cli.timeline import Timeline, cpu_snapshot
from areal_cli.trainer.group import TorchrunTrainer, TrainerGroup

STEPS = "areal_cli.trainer.steps"  # the trainer-side functions, called by name through the trainer group


@dataclass
class RunContext:
    """Everything a running job holds: config, output dir, task, tokenizer, trainer group, client, servers."""

    cfg: TrainConfig
    out: Path
    task: Task
    tokenizer: Any
    trainer: TrainerGroup
    client: RolloutClient
    fleet: Fleet
    reward_pool: RewardPool
    episodes: EpisodeClient  # the training episode client template
    eval_episodes: EpisodeClient  # the same with the held-out evaluation's sampling
    eval_items: list[Item]
    status: RunStatus
    t0: float
    timeline: Timeline | None = None
    rollout_process: RolloutProcess | None = None  # the controller in its own process (rollout_process: true)
    version: int = 0  # the policy version the servers hold
    bench: Any = None  # in-loop benchmark evaluation (areal_cli.eval.in_loop.BenchmarkEval) or None
    eval_failures: int = 0  # reward failures of the latest held-out evaluation (counted as wrong)
    tracker: Any = None  # experiment tracking (areal_cli.tracking.Tracker) or None
    served: tuple[Path, int] | None = None  # (weights dir, policy version) the servers hold
    fleet_lock: asyncio.Lock | None = None  # held by weight updates and by server restarts
    supervisor: Any = None  # areal_cli.rollout.supervisor.FleetSupervisor (controller in this process)
    supervisor_task: asyncio.Task | None = None
    sandbox: dict | None = None  # code tasks: the sandbox isolation in force (areal_cli.sandbox.status)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    async def train(self, name: str, *args, **kwargs):
        """``await self.trainer.call(name, ...)``: engine work, in order (see :mod:`areal_cli.trainer.group`)."""
        return await self.trainer.call(name, *args, **kwargs)


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


def run_training(cfg: TrainConfig, out: Path, *, live: bool = True, record_timeline: bool = False,
                 resume: Checkpoint | None = None) -> dict:
    """Run warm start + asynchronous RL for ``cfg``; return the summary (also written to summary.json).

    Args:
        record_timeline: also write ``timeline.json`` (:class:`~areal_cli.timeline.Timeline`).
        resume: continue the run in ``out`` from this verified checkpoint (see :func:`resume_training`).
    Raises:
        UserError: bad task (unknown preset, unreadable or malformed records, user code that does not load),
            existing run directory, bad model path, or unavailable pinned cpus -- all before anything is written.
    """
    model_dir = None
    if cfg.model_path is not None:
        from areal_cli.models.gguf import resolve_model
        from areal_cli.rollout.engine import ModelSpec

        model_dir = resolve_model(cfg.model_path, log=print)  # a .gguf file: dequantised once into a cache
        if not (model_dir / "config.json").is_file():
            raise UserError(f"model_path '{cfg.model_path}': not a model directory (no config.json) or .gguf file")
        ModelSpec.from_model_dir(model_dir)  # an unsupported family or feature: one line, before anything
    if cfg.rollout_engine == "sglang":
        import importlib.util

        if importlib.util.find_spec("sglang") is None:
            raise UserError(f"rollout_engine: sglang: the 'sglang' package is not installed here (a GPU run: "
                            f"`areal reproduce {cfg.recipe}` on a machine with its GPUs, or `areal launch slurm "
                            f"{cfg.recipe} ...` on a cluster; -o rollout_engine=embedded runs the CPU server)")
    if cfg.model_path is None and cfg.rollout_engine != "embedded" and resume is None:
        raise UserError(f"field 'model_path': rollout_engine {cfg.rollout_engine} serves a model directory; set "
                        f"-o model_path=DIR (a published recipe's base model: `areal download {cfg.recipe} "
                        f"--local-dir DIR`, then -o model_path=DIR/model -o dataset=DIR/data/FILE)")
    check_cpus(cfg)
    from areal_cli.tracking import Tracker, parse_loggers

    loggers = parse_loggers(cfg.loggers)  # a missing package: one line, before any work
    if resume is not None and record_timeline:
        raise UserError("a resumed run cannot record a timeline (areal bench runs are not resumed)")
    task = Task(cfg)
    if cfg.epochs and resume is None:
        cfg = dataclasses.replace(cfg, max_steps=steps_for_epochs(cfg, task))
    created = not out.exists()
    if resume is None:
        prepare_out_dir(out)
    torch.set_num_threads(cfg.torch_threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if resume is None:
        write_json_atomic(out / "config.json", cfg.to_dict())
    status = RunStatus(cfg, out, live=live)
    timeline = Timeline() if record_timeline else None
    tracker = None
    try:
        tracker = Tracker(loggers, out, cfg.to_dict(), project=cfg.wandb_project,
                          resume_step=resume.step if resume is not None else None, log=status.log)
        with status:
            summary = asyncio.run(_run(cfg, out, task, status, timeline, resume, model_dir, tracker))
        tracker.summary(summary)
    except UserError:
        # bad input found before the first RL step ended (a prompt the tokenizer cannot take, a workflow or reward
        # that breaks at once, a micro-batch budget too small, ...): nothing worth keeping was made, so leave
        # nothing behind -- a half-made run directory would block the same --out next time
        if resume is None and created and not _has_rl_steps(out / "metrics.jsonl"):
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        if tracker is not None:
            tracker.close()
    status.summary(summary)
    return summary


def _has_rl_steps(metrics: Path) -> bool:
    """Whether ``metrics.jsonl`` holds at least one finished RL step."""
    try:
        return any('"phase": "rl"' in line for line in metrics.read_text().splitlines())
    except OSError:
        return False


def steps_for_epochs(cfg: TrainConfig, task: Task) -> int:
    """RL steps of ``cfg.epochs`` passes over the training records: ``epochs * (records // batch_size)``
    (AReaL counts steps per epoch the same way, before any filtering).

    Raises:
        UserError: a generated (endless) dataset, or fewer records than one batch.
    """
    if task.train_records is None:
        raise UserError(f"field 'epochs': task '{task.name}' streams generated records; set max_steps instead")
    per_epoch = len(task.train_records) // cfg.batch_size
    if per_epoch == 0:
        raise UserError(f"field 'epochs': {len(task.train_records)} training records do not fill one batch of "
                        f"{cfg.batch_size} prompts")
    return cfg.epochs * per_epoch


def resume_training(path: Path, *, live: bool = True) -> dict:
    """``areal train --resume PATH``: continue a run killed or stopped after a checkpoint.

    ``PATH`` is the run directory (its newest checkpoint is used) or one ``checkpoints/step-*`` directory.
    The configuration is the one stored in the checkpoint. Everything is verified before anything is
    written; see :mod:`areal_cli.checkpoint` for what is restored and what is regenerated.
    Raises:
        UserError: no checkpoint, a corrupted one (naming the file), a finished run, a missing base model.
    """
    ckpt = load_checkpoint(path)
    run_dir = ckpt.path.parent.parent
    if (run_dir / "summary.json").exists():
        raise UserError(f"{run_dir}: the run already finished (summary.json); nothing to resume")
    cfg = _config_of_checkpoint(ckpt)
    truncate_metrics(run_dir / "metrics.jsonl", ckpt.step, write=False)  # checked now, cut when the run restarts
    if cfg.model_path is None and not (run_dir / "model" / "base" / "config.json").is_file():
        raise UserError(f"{run_dir / 'model' / 'base'}: the run's base model is missing; cannot resume")
    return run_training(cfg, run_dir, live=live, resume=ckpt)


def _config_of_checkpoint(ckpt: Checkpoint) -> TrainConfig:
    """The run's TrainConfig as stored in the (checksummed) checkpoint state."""
    stored = ckpt.state.get("config")
    where = ckpt.path / "state.json"
    if not isinstance(stored, dict):
        raise UserError(f"{where}: field 'config': missing")
    known = {f.name for f in fields(TrainConfig)} - {"extra"}
    unknown = sorted(set(stored) - known)
    if unknown:
        raise UserError(f"{where}: field 'config.{unknown[0]}': unknown key (written by another version?)")
    cfg = TrainConfig(**stored)
    cfg.validate(str(where))
    return cfg


def _rounded(key: str, value):
    """A trainer statistic for metrics.jsonl: 6 decimals, but 4 significant digits for the logprob mismatch
    (~1e-6 nats, which 6 decimals would erase); None and bools as they are."""
    if value is None or isinstance(value, bool):
        return value
    if key.startswith("logprob_mismatch_") and key != "logprob_mismatch_tokens":
        return float(f"{value:.4g}")
    return round(value, 6)


def _sandbox_in_force(cfg: TrainConfig, task: Task, status: RunStatus) -> dict | None:
    """For a code task: apply ``sandbox_isolation``, probe the sandbox once, warn in one line when its level is
    below full (recorded in metrics.jsonl's first line and summary.json).

    Raises:
        UserError: the sandbox refuses (``strict`` without every layer, root without a reachable interpreter).
    """
    if task.kind != "code":
        return None
    from areal_cli.sandbox import SandboxError
    from areal_cli.sandbox.status import isolation_in_force, reduced_warning

    try:
        state = isolation_in_force(cfg.sandbox_isolation)
    except SandboxError as exc:  # the key is named only when its value is what refused
        where = "field 'sandbox_isolation': " if cfg.sandbox_isolation == "strict" and "strict" in str(exc) else ""
        raise UserError(f"{where}code sandbox: {exc}") from None
    warning = reduced_warning(state)
    if warning:
        status.warn(warning)
    return state


async def _run(cfg: TrainConfig, out: Path, task: Task, status: RunStatus, timeline: Timeline | None = None,
               resume: Checkpoint | None = None, model_dir: Path | None = None, tracker: Any = None) -> dict:
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer

    t0 = status.t0
    if model_dir is not None:
        base = model_dir
    elif resume is not None:
        base = out / "model" / "base"
    else:
        status.log("building the embedded tiny Qwen3 model and tokenizer")
        base = build_tiny_model(out / "model" / "base", seed=cfg.seed, corpus=task.tokenizer_corpus(),
                                vocab_size=cfg.model_vocab_size, hidden_size=cfg.model_hidden_size,
                                num_layers=cfg.model_num_layers, chat_template=cfg.model_chat_template)
    tokenizer = load_tokenizer(base)
    task.bind(tokenizer)
    eval_items = task.heldout(cfg.eval_n_prompts) if cfg.eval_n_prompts else []
    if cfg.eval_n_prompts and not eval_items:
        if task.dropped_too_long:
            raise UserError(f"field 'max_prompt_len': every held-out prompt is longer than {cfg.max_prompt_len} tokens "
                            f"(raise it, or eval_n_prompts: 0 for no held-out evaluation)")
        raise UserError(f"field 'eval_n_prompts': task '{task.name}' has no held-out prompt to evaluate "
                        f"(set eval_dataset or heldout_fraction, or eval_n_prompts: 0)")
    stop_ids = stop_token_ids(base, tokenizer)
    from areal_cli.eval.in_loop import BenchmarkEval

    vocab = json.loads((base / "config.json").read_text()).get("vocab_size")
    if vocab and 1 <= cfg.top_k < int(vocab):
        raise UserError(f"field 'top_k': training samples must come from the untruncated policy: with top_k {cfg.top_k} "
                        f"< the vocabulary ({vocab}) the rollout servers report logprobs of the untruncated "
                        "distribution (as SGLang does), so pi_prox/pi_behav would ignore the truncation; use -1 "
                        "(or a value >= the vocabulary, as AReaL's 1000000)")
    bench = BenchmarkEval.prepare(cfg, tokenizer, base, stop_ids, int(vocab), tiny_model=cfg.model_path is None)
    serve_dir, serve_version = base, 0
    if resume is not None:  # the servers restart with the checkpointed policy version
        serve_version = int(resume.state["version"])
        serve_dir = _restore_weights_dir(out, resume)
        status.log(f"resuming from {resume.path} (step {resume.step}, policy version {serve_version})")
    trainer_cpus, server_cpus, controller_cpus = check_cpus(cfg)
    fleet = launch_servers(cfg, serve_dir, serve_version, out, status.log)
    # this process's threads other than the trainer's: the controller's event loop, or, when the controller
    # runs in its own process, the trainer's side (receiving batches, publishing)
    main_cpus = trainer_cpus if (cfg.rollout_process and trainer_cpus) else controller_cpus
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
        sandbox = _sandbox_in_force(cfg, task, status)  # before the reward workers start: they inherit the setting
        pool = open_reward_pool(cfg, task)
        engine_kwargs = dict(hf_model_dir=base, lr=cfg.sft_lr, weight_decay=cfg.weight_decay,
                             betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps, grad_clip=cfg.grad_clip,
                             seed=cfg.seed)
        trainer = await start_trainer(cfg, engine_kwargs, out, trainer_cpus, status.log)
        if resume is not None:
            await trainer.call("areal_cli.checkpoint:restore_trainer", resume)
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
                               interruptible=cfg.interruptible, on_activity=on_activity)
        if cfg.rollout_process:  # starts now, builds its controller during the warm start
            remote = RolloutProcess(RolloutSpec(cfg, str(base), urls, vocab_size,
                                                controller_cpus, timeline is not None), on_activity=on_activity)
        episodes = episode_client(cfg, client, pool, tokenizer, task, stop_ids)
        eval_sampling = dataclasses.replace(episodes.sampling, temperature=cfg.eval_temperature)
        eval_episodes = episode_client(cfg, client, pool, tokenizer, task, stop_ids, sampling=eval_sampling,
                                       group_size=cfg.eval_n_samples, rid_prefix="eval-")
        ctx = RunContext(cfg, out, task, tokenizer, trainer, client, fleet, pool, episodes, eval_episodes, eval_items,
                         status, t0, timeline, remote, version=serve_version, bench=bench, tracker=tracker,
                         served=(serve_dir, serve_version))
        ctx.sandbox = sandbox
        if not cfg.rollout_process:  # the controller's client is this one: heal servers that die
            from areal_cli.rollout.supervisor import FleetSupervisor

            ctx.fleet_lock = asyncio.Lock()
            ctx.supervisor = FleetSupervisor(
                fleet, client, weights_of=lambda: ctx.served, lock=ctx.fleet_lock,
                can_restart=cfg.weight_update_mode == "disk", max_restarts=cfg.server_max_restarts,
                stall_s=cfg.server_stall_timeout_s, log=status.log, clock=lambda: time.monotonic() - t0)
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
        if trainer is not None and cfg.weight_update_mode == "xccl":
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


def _restore_weights_dir(out: Path, ckpt: Checkpoint) -> Path:
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


# --------------------------------------------------------------------------------------------------
# Held-out accuracy
# --------------------------------------------------------------------------------------------------
async def evaluate(ctx: RunContext) -> float | None:
    """Held-out accuracy in [0, 1]: the task's workflow on the fixed held-out items with the evaluation's
    sampling (``eval_temperature``, default greedy; ``eval_n_samples`` per prompt), the fraction of samples
    whose reward is > 0. An episode the workflow rejects, or whose reward failed (error / timeout), counts as
    wrong and is counted (``ctx.eval_failures``), as ``areal eval`` counts grader failures. Every token must come
    from one policy version (the servers' current one): nothing may update the weights during an evaluation.

    Returns None when the run has no held-out items (``eval_n_prompts: 0``).
    Raises:
        WorkflowError: the workflow raised or returned something that is not a Group (one line).
        RuntimeError: the samples mix policy versions.
    """
    from areal_cli.rollout.controller import check_group, check_reward_health

    if not ctx.eval_items:
        return None
    spec = ctx.task.workflow_spec

    async def one(i: int, item: Item) -> Group | None:
        try:
            group = await ctx.task.workflow.arun_episode(ctx.eval_episodes.for_episode(i), item)
        except RewardFailed:
            return None
        except (asyncio.CancelledError, UserError, ServerError):
            raise
        except Exception as e:  # noqa: BLE001 - a bug in the workflow: one line naming it
            raise WorkflowError(f"workflow {spec}: arun_episode raised {type(e).__name__}: {e} "
                                f"(held-out item {item.where or item.id})") from e
        if group is not None:
            check_group(group, spec, item)
        return group

    failed_before = ctx.eval_episodes.stats.reward_status["error"] + ctx.eval_episodes.stats.reward_status["timeout"]
    groups = await asyncio.gather(*(one(i, it) for i, it in enumerate(ctx.eval_items)))
    stats = ctx.eval_episodes.stats
    ctx.eval_failures = stats.reward_status["error"] + stats.reward_status["timeout"] - failed_before
    check_reward_health(stats, ctx.task.reward_spec)
    n = ctx.cfg.eval_n_samples
    correct = sum(sum(s.reward > 0 for s in g.samples) for g in groups if g is not None)
    total = sum(max(len(g.samples), n) if g is not None else n for g in groups)
    versions = {v for g in groups if g is not None for s in g.samples for v in s.versions if v >= 0}
    if versions - {ctx.version}:
        raise RuntimeError(f"held-out evaluation mixed policy versions {sorted(versions)} (expected {ctx.version})")
    return correct / max(total, 1)


async def _load_version(ctx: RunContext, controller: RolloutController, path: Path, version: int) -> None:
    """Load published weights on every server, then let the controller admit rollouts of ``version``."""
    async with _fleet_lock(ctx):
        await ctx.client.update_weights_from_disk(str(path.resolve()), version)
        ctx.version, ctx.served = version, (path, version)
    controller.notify_version(version)


def _fleet_lock(ctx: RunContext):
    """The lock that keeps weight updates and server restarts apart (a no-op context without supervision)."""
    return ctx.fleet_lock if ctx.fleet_lock is not None else contextlib.nullcontext()


async def _sync_distributed(ctx: RunContext, version: int) -> None:
    """``weight_update_mode: xccl``: every trainer rank gathers the HF weights, rank 0 broadcasts them to the
    servers in buckets (:func:`areal_cli.rollout.weight_sync.sync_weights_from_engine`), around a pause of the
    servers (interruptible) or a hold of new submissions (non-interruptible)."""
    from areal_cli.rollout.weight_sync import update_weights_distributed

    spec = weight_sync_spec(ctx.cfg, ctx.client)
    async with _fleet_lock(ctx):
        await update_weights_distributed(
            ctx.client, lambda: ctx.train("areal_cli.rollout.weight_sync:sync_weights_from_engine", spec, version),
            version)


async def publish(ctx: RunContext, version: int, tag: str) -> Path:
    """Write the trainer's weights in HF format and load them on every server as ``version``."""
    path = await ctx.train("engine.save_hf", ctx.out / "weights" / tag)
    async with _fleet_lock(ctx):
        await ctx.client.update_weights_from_disk(str(path.resolve()), version)
        ctx.version, ctx.served = version, (path, version)
    return path


# --------------------------------------------------------------------------------------------------
# Phase 1: supervised warm start
# --------------------------------------------------------------------------------------------------
async def warm_start(ctx: RunContext) -> dict:
    """Supervised warm start: the SFT stage (:class:`areal_cli.sft.SftStage`, recipe keys ``sft_*``) on the
    task's training split, until held-out accuracy reaches ``sft_stop_accuracy``; rolls back one eval
    interval if accuracy overshoots 0.5.

    Loss: mean negative log-likelihood over response tokens only (prompt tokens masked), sequences packed
    (:mod:`areal_cli.sft`).
    Returns:
        {"steps", "accuracy", "seconds"} of the warm start.
    Raises:
        UserError: the ``sft_*`` keys do not fit the examples (fewer examples than a batch, a sequence longer
            than ``sft_max_tokens_per_mb`` or ``sft_pack_row_tokens``).
    """
    from areal_cli.sft import SftConfig, SftStage

    cfg = ctx.cfg
    t_start = time.monotonic()
    acc = await evaluate(ctx)
    ctx.status.phase("warm start", step=0, acc=acc)
    step, kept_state, kept_step = 0, None, 0
    def below(a: float | None) -> bool:  # no held-out set: the warm start runs all sft_max_steps
        return a is None or a < cfg.sft_stop_accuracy

    if cfg.sft_max_steps > 0 and below(acc):
        examples = ctx.task.sft_examples(cfg.sft_n_examples)
        eos = ctx.tokenizer.eos_token_id
        encoded = [(item.prompt_ids, ctx.tokenizer.encode(target, add_special_tokens=False) + [eos])
                   for item, target in examples]
        sft_cfg = SftConfig.from_train_config(cfg)
        try:  # checked here (the stage itself lives in the trainer)
            SftStage(None, encoded, sft_cfg, pad_id=ctx.tokenizer.pad_token_id)
        except ValueError as e:
            field = "sft_batch_size" if "batch" in str(e) else "sft_max_tokens_per_mb"
            raise UserError(f"{cfg.recipe}: field '{field}': the warm start has {len(encoded)} example(s) "
                            f"(sft_n_examples={cfg.sft_n_examples}): {e}") from None
        await ctx.train(f"{STEPS}:sft_begin", encoded, sft_cfg, ctx.tokenizer.pad_token_id)
    while step < cfg.sft_max_steps and below(acc):
        # weights evaluated below the stop accuracy: where to roll back to if the next eval overshoots 0.5
        await ctx.train(f"{STEPS}:keep_weights")
        kept_state, kept_step = True, step
        for _ in range(min(cfg.sft_eval_every, cfg.sft_max_steps - step)):
            stats = await ctx.train(f"{STEPS}:sft_step")
            step += 1
        await publish(ctx, 0, f"sft-step{step}")
        acc = await evaluate(ctx)
        ctx.status.phase("warm start", step=step, acc=acc, loss=stats["loss"])
    if cfg.sft_max_steps > 0 and kept_state is not None:
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


# --------------------------------------------------------------------------------------------------
# Phase 2: asynchronous RL
# --------------------------------------------------------------------------------------------------
def _cpu_snapshot(ctx: RunContext) -> dict:
    """CPU seconds of this process, the trainer ranks, the rollout process and the servers (timeline)."""
    return cpu_snapshot(trainer_pids=list(ctx.trainer.pids) if isinstance(ctx.trainer, TorchrunTrainer) else [],
                        rollout_pid=ctx.rollout_process.pid if ctx.rollout_process is not None else None,
                        server_pids=[p.pid for p in ctx.fleet.procs])


async def rl_loop(ctx: RunContext, warm: dict, resume: Checkpoint | None = None) -> dict:
    """Asynchronous RL until ``max_steps``, the target accuracy or the time limit.

    Every ``checkpoint_every`` steps a checkpoint (:func:`save_checkpoint`) is written after the step's
    metrics line. With ``resume``, the loop continues after the checkpointed step: weights and optimizer are
    already restored (:func:`_run`); here the data position, staleness counters, controller counters and
    RNG states are, ``metrics.jsonl`` is cut back to the checkpointed step, and the next line carries
    ``"resumed_from"`` (semantics: :mod:`areal_cli.checkpoint`).

    With a :class:`Timeline`, each step adds ``{"step", "start", "end"`` (end = new version published,
    before any eval), ``"tokens"`` (prompt + response tokens of the batch: what the trainer consumed,
    AReaL's ``ppo_actor/n_tokens``), ``"response_tokens"``, ``"n_samples"``, ``"staleness"`` (histogram
    {versions behind at the first token: samples}), ``"wait_s"``, ``"train_s"``, ``"train_cpu_s"``,
    ``"publish_s"``, ``"eval_s"``, ``"evaluated"`` (held-out accuracy measured after this step), ``"accuracy"``
    (latest measured), ``"cpu"`` (CPU seconds at ``end``),
    ``"generated_tokens"`` (all tokens generated since RL start, kept or dropped, at ``end``)}.
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
    if rs is None:
        await ctx.train("engine.set_lr", cfg.lr)
        await ctx.train("engine.optimizer.state.clear")  # fresh AdamW moments for the RL phase
        version, acc, first_step = 0, warm["accuracy"], 1
        time_to_target, trained_tokens, last_tokens = None, 0, 0
        t_rl = time.monotonic()
    else:  # optimizer state and its lr were restored with the weights
        version, acc, first_step = int(rs["version"]), rs["accuracy"], int(rs["step"]) + 1
        time_to_target, trained_tokens, last_tokens = rs["time_to_target"], rs["trained_tokens"], rs["last_tokens"]
        resumes.append(_restore_controller(controller, cfg, resume, truncate_metrics(metrics_path, resume.step)))
        now = time.monotonic()  # the run's clocks continue from the checkpoint (the downtime is not counted)
        ctx.t0 = ctx.status.t0 = now - rs["elapsed_s"]
        t_rl = now - rs["rl_elapsed_s"]
        restore_rng(resume.load_rng())
        ctx.status.log(f"resumed at step {first_step}: {len(rs['data']['pending'])} pending prompt(s) re-issued")
    if tl is not None:
        tl.marks["rl_start"] = t_rl
        tl.cpu["rl_start"] = _cpu_snapshot(ctx)
    last_bench = None  # the latest in-loop benchmark results
    with metrics_path.open("a" if rs else "w") as mf:
        if rs is None:
            first = {"step": 0, "version": 0, "phase": "warm_start_end", "reward_mean": None, "accuracy": acc,
                     "staleness_max": 0, "staleness_mean": 0.0, "elapsed_s": round(ctx.elapsed(), 3),
                     "rl_elapsed_s": 0.0, "warm_start_steps": warm["steps"],
                     "warm_start_s": round(warm["seconds"], 3), "evaluated": True}
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
        cs0 = controller.stats.as_dict()  # (a rollout process reports its counters with its first group)
        scored = (cs0.get("reward_sum_scored", 0.0), cs0.get("samples_scored", 0))  # before the group filter
        loading: asyncio.Task | None = None  # the servers loading the latest version
        mismatch_warned = False
        try:
            last_t = time.monotonic()
            for step in range(first_step, cfg.max_steps + 1):
                if cfg.lr_scheduler != "constant" or cfg.warmup_proportion:
                    from areal_cli.sft import lr_at

                    await ctx.train("engine.set_lr", lr_at(step - 1, cfg.max_steps, cfg))
                t_wait = time.monotonic()
                groups = await _get_batch_watched(
                    ctx, controller, step, consumer_version=version if cfg.stale_groups == "drop" else None)
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
                if loading is not None:  # the servers finish loading the previous version first
                    await loading
                    loading = None
                path = ctx.out / "weights" / f"v{version}"
                # the last step: max_steps, or the time limit (the final policy is then evaluated and kept too)
                time_up = bool(cfg.time_limit_s) and ctx.elapsed() > cfg.time_limit_s
                last = step == cfg.max_steps or time_up
                keep_copy = last or bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
                if cfg.weight_update_mode == "xccl":  # broadcast from the trainer; servers paused meanwhile
                    await _sync_distributed(ctx, version)
                    ctx.version = version
                    controller.notify_version(version)
                    if keep_copy:  # the final weights and checkpoints still go to disk
                        await ctx.train("engine.save_hf", path)
                else:
                    await ctx.train("engine.save_hf", path)
                    # The servers load it while the trainer goes on with the next batch (already generated
                    # under the staleness bound); rollouts of the new version are admitted once it is loaded.
                    loading = asyncio.create_task(_load_version(ctx, controller, path, version))
                eval_due = bool(cfg.eval_every) and (step % cfg.eval_every == 0 or last)
                bench_every = cfg.eval_benchmark_every or cfg.eval_every
                bench_due = ctx.bench is not None and bool(bench_every) and (step % bench_every == 0
                                                                             or last)
                if (eval_due or bench_due or last) and loading is not None:
                    await loading
                    loading = None
                old = ctx.out / "weights" / f"v{version - 2}"
                if old.exists():
                    shutil.rmtree(old, ignore_errors=True)
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
                line["evaluated"] = eval_due
                if eval_due:
                    line["eval_reward_failures"] = ctx.eval_failures
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
                ctx.status.step(line, cs)
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    if loading is not None:  # the servers must hold this version: the staleness counter is v
                        await loading
                        loading = None
                    engine_steps = await ctx.train("engine.steps")
                    state = {
                        "step": step, "version": version, "accuracy": acc, "elapsed_s": line["elapsed_s"],
                        "rl_elapsed_s": line["rl_elapsed_s"], "trained_tokens": trained_tokens,
                        "last_tokens": last_tokens, "time_to_target": time_to_target, "warm_start": warm,
                        **_controller_state(controller, stream, cfg, step), "engine_steps": engine_steps,
                        "resumes": resumes, "config": cfg.to_dict(),
                    }
                    rng = capture_rng()
                    t_ck = time.monotonic()
                    ck = await ctx.train(f"{STEPS}:save_trainer_checkpoint", ctx.out, step, hf_dir=path,
                                         rng=rng, state=state, keep=cfg.keep_checkpoints)
                    ctx.status.log(f"checkpoint {ck.relative_to(ctx.out)} ({time.monotonic() - t_ck:.2f} s)")
                if time_to_target is None and cfg.target_accuracy and acc is not None and acc >= cfg.target_accuracy:
                    time_to_target = {"step": step, "elapsed_s": line["elapsed_s"], "rl_elapsed_s": line["rl_elapsed_s"]}
                    break
                if time_up:
                    ctx.status.log(f"time limit {cfg.time_limit_s}s reached: the policy of step {step} is the final one")
                    break
            if loading is not None:
                await loading
                loading = None
        finally:
            if loading is not None:  # an error or Ctrl-C left a weight update running
                loading.cancel()
                await asyncio.gather(loading, return_exceptions=True)
            if tl is not None:
                tl.marks["rl_end"] = tl.steps[-1]["end"] if tl.steps else time.monotonic()
                tl.cpu["rl_end"] = tl.steps[-1]["cpu"] if tl.steps else _cpu_snapshot(ctx)
                tl.marks["controller"] = controller.stats.as_dict()
            await controller.stop()
            aclose = getattr(ctx.task.workflow, "aclose", None)  # a workflow's own servers (the agent proxy)
            if aclose is not None and asyncio.iscoroutinefunction(aclose):
                try:
                    await aclose()
                except Exception as e:  # noqa: BLE001 - closing must not hide the run's outcome
                    ctx.status.warn(f"workflow aclose failed: {type(e).__name__}: {e}")
            # also after Ctrl-C: the curve of the steps that were completed
            from areal_cli.plots import plot_learning_curve

            plot_learning_curve(metrics_path, ctx.out / "learning_curve.png", target=cfg.target_accuracy)
    final = ctx.out / "weights" / f"v{version}"
    summary = {
        "recipe": cfg.recipe, "ok": True, "final_version": version, "final_accuracy": acc,
        "target_accuracy": cfg.target_accuracy, "target_reached": time_to_target is not None,
        "warm_start": warm, "time_to_target": time_to_target, "elapsed_s": round(ctx.elapsed(), 3),
        "final_weights": str(final), "controller": controller.stats.as_dict(),
        "reward_failures": controller.stats.reward_failure_examples, "task": ctx.task.name,
    }
    if ctx.bench is not None:
        summary["eval_benchmarks"] = ctx.bench.record()
        summary["last_eval_benchmarks"] = last_bench
    if resumes:
        summary["resumes"] = resumes
    if ctx.sandbox is not None:
        summary["sandbox_isolation"] = ctx.sandbox
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


async def _get_batch_watched(ctx: RunContext, controller: Any, step: int, every_s: float = 60.0,
                             consumer_version: int | None = None) -> list[Group]:
    """``controller.get_batch(batch_size)``, saying once a minute why the wait is long when episodes are being
    dropped or rejected instead of accepted (a success-rate filter that drops every group of a model that
    always or never succeeds starves the trainer, as in AReaL; the counters say so)."""
    task = asyncio.ensure_future(controller.get_batch(ctx.cfg.batch_size, consumer_version=consumer_version))
    start = dict(controller.stats.as_dict())
    t0 = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            now = controller.stats.as_dict()
            delta = {k: now.get(k, 0) - start.get(k, 0) for k in ("groups_accepted", "groups_dropped_filter",
                                                                   "groups_rejected", "groups_dropped_reward_failure")}
            ctx.status.log(f"step {step}: waiting {time.monotonic() - t0:.0f} s for a batch of {ctx.cfg.batch_size} "
                           f"groups: {delta['groups_accepted']} accepted, {delta['groups_dropped_filter']} dropped by "
                           f"the success-rate filter [{ctx.cfg.success_rate_lb}, {ctx.cfg.success_rate_ub}], "
                           f"{delta['groups_rejected']} rejected by the workflow, "
                           f"{delta['groups_dropped_reward_failure']} dropped by reward failures"
                           + ("; almost every group is all-correct or all-wrong: a longer warm start (sft_max_steps), "
                              "a wider success_rate_lb..success_rate_ub range or a larger group_size gives the trainer "
                              "batches" if delta["groups_dropped_filter"] > 10 * max(delta["groups_accepted"], 1)
                              else ""))
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _controller_state(controller: RolloutController, stream: PromptStream, cfg: TrainConfig, step: int) -> dict:
    """The controller's part of a checkpoint, read in one go (no await): staleness counters and their
    capacity, controller counters, data position (:class:`PromptStream`)."""
    counters = controller.staleness.state_dict()
    return {
        "staleness": counters,
        "staleness_capacity": staleness_capacity(cfg.max_head_offpolicyness, cfg.batch_size, counters),
        "trained_groups": step * cfg.batch_size,
        "controller": {f.name: getattr(controller.stats, f.name) for f in fields(controller.stats)},
        "data": stream.position(controller.pending_group_ids()),
    }


def _restore_controller(controller: RolloutController, cfg: TrainConfig, ckpt: Checkpoint, dropped_lines: int) -> dict:
    """Set the staleness and controller counters of a resumed run (before the controller starts).

    Staleness: version = the checkpoint's, accepted = groups trained, running = 0, rejected kept; the
    pending groups are re-admitted first, after which the capacity equals the checkpoint's (see
    :mod:`areal_cli.checkpoint`). Returns the record of this resume (also in summary.json ``resumes``).
    """
    rs = ckpt.state
    sm = controller.staleness
    sm.set_version(int(rs["staleness"]["version"]))
    sm.accepted, sm.running, sm.rejected = int(rs["trained_groups"]), 0, int(rs["staleness"]["rejected"])
    for name, value in rs["controller"].items():
        setattr(controller.stats, name, Counter(value) if name == "reward_status" else value)
    restored = sm.state_dict()
    n_pending = len(rs["data"]["pending"])
    eta, b = cfg.max_head_offpolicyness, cfg.batch_size
    return {
        "checkpoint": str(ckpt.path.relative_to(ckpt.path.parent.parent)), "step": ckpt.step,
        "metrics_lines_dropped": dropped_lines, "pending_reissued": n_pending,
        "staleness_checkpoint": rs["staleness"], "staleness_restored": restored,
        "capacity_checkpoint": rs["staleness_capacity"],
        "capacity_restored": staleness_capacity(eta, b, restored),
        "capacity_after_readmission": staleness_capacity(eta, b, {**restored, "running": n_pending}),
    }

