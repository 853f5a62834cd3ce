"""The asynchronous RL loop of ``areal train``, top to bottom.

Processes (DESIGN §3): this process runs the rollout controller (asyncio) and the Megatron-core trainer
(its steps in a worker thread, so rollouts keep streaming while it trains); ``n_servers`` embedded rollout
servers run as child processes; rewards are computed in a worker-process pool. With
``trainer_data_parallel x trainer_tensor_parallel x trainer_pipeline_parallel > 1`` the trainer is a group of
torchrun ranks instead (:class:`areal_cli.trainer.group.TorchrunTrainer`; logs ``logs/trainer-rank*.log``).
Every trainer use goes through the group (:mod:`areal_cli.trainer.group`): engine methods by name and the
trainer-side functions of this module (:func:`train_on_groups`, :func:`sft_begin`, ...), which run on every
rank with the same arguments.

1. Build the embedded tiny Qwen3 (or use ``model_path``), start the servers and the reward pool.
2. Supervised warm start (part of the recipe): train on the task's training split until held-out greedy
   accuracy reaches ``sft_stop_accuracy`` (<= 0.5). That policy is version 0.
3. RL steps: wait for ``batch_size`` accepted groups (admitted under the staleness bound eta), recompute
   proximal logprobs, compute advantages, one decoupled-PPO update per minibatch, publish version v+1 in
   HF format, pause -> load -> continue every server (interrupted samples resume with their prefix; the
   servers load while the trainer takes its next batch, and the load is awaited before the next publish
   and before an eval), measure held-out accuracy, append one line to ``metrics.jsonl``.

For ``areal bench throughput`` (off by default, output unchanged): ``record_timeline=True`` writes
``timeline.json`` (activity intervals of the trainer and of every server, per-step consumed tokens and
staleness, CPU seconds per process); ``trainer_cpus`` / ``server_cpus`` / ``controller_cpus`` pin the
trainer thread, the servers, and the rest of this process (controller, reward workers) to chosen cores;
``interruptible: false`` makes weight updates wait for in-flight samples instead of aborting them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from areal_cli.atomic import write_json_atomic
from areal_cli.checkpoint import (
    Checkpoint,
    PromptStream,
    capture_rng,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
    staleness_capacity,
    truncate_metrics,
)
from areal_cli.config import TrainConfig, parse_cpu_list
from areal_cli.errors import UserError
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.controller import Group, PromptItem, RolloutController
from areal_cli.rollout.protocol import SamplingParams
from areal_cli.rollout.remote_controller import RolloutProcess, RolloutSpec
from areal_cli.rollout.fleet import Fleet, FleetSpec, launch_fleet
from areal_cli.rollout.staleness import StalenessManager
from areal_cli.reward.pool import RewardPool
from areal_cli.run_status import RunStatus
from areal_cli.tasks import registry
from areal_cli.trainer.advantages import (
    broadcast_to_tokens,
    global_normalized_token_advantages,
    group_normalized_advantages,
)
from areal_cli.trainer.batch import TrainBatch, build_train_batch
from areal_cli.trainer.decoupled_ppo import DecoupledPPOConfig, decoupled_ppo_loss
from areal_cli.trainer.group import ENV_AUTHKEY_FILE, LocalTrainer, TorchrunTrainer, TrainerGroup

ENV_LISTEN = "AREAL_CONTROLLER_LISTEN"  # host:port: attach to externally launched trainer ranks (multi-node)


@dataclass
class Timeline:
    """What ran when, for throughput accounting (``timeline.json``); times are ``time.monotonic()`` s.

    ``events``: ``{"lane", "kind", "start", "end"}`` intervals. Lanes: ``"trainer"`` (kinds ``wait`` for
    a batch, ``train`` = proximal recompute + PPO update, ``publish`` = save weights + load on the servers,
    ``eval``) and ``"server<i>"`` (``generate``: at least one request of this server in flight, seen by the
    client; ``update``: weight-update window). ``steps``: one record per RL step (see :func:`rl_loop`).
    ``cpu``: CPU seconds of this process and of every server process at RL start and end.
    """

    events: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    marks: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)

    def add(self, lane: str, kind: str, start: float, end: float) -> None:
        self.events.append({"lane": lane, "kind": kind, "start": round(start, 6), "end": round(end, 6)})

    def to_dict(self) -> dict:
        return {"clock": "time.monotonic", "marks": self.marks, "events": self.events, "steps": self.steps,
                "cpu": self.cpu}


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads) from ``/proc``; None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Pin every thread of process ``pid`` (0 = this one) to ``cpus``; later threads inherit it."""
    task_dir = Path(f"/proc/{pid or os.getpid()}/task")
    tids = [int(t.name) for t in task_dir.iterdir()] if task_dir.is_dir() else [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            pass


CPU_FIELDS = ("trainer_cpus", "server_cpus", "controller_cpus")


def _check_cpus(cfg: TrainConfig) -> tuple[frozenset[int], frozenset[int], frozenset[int]]:
    """The trainer, server and controller cpu sets of ``cfg``, checked against this process's cpus.

    Raises:
        UserError: a cpu outside this process's affinity, or pinning unsupported on this OS.
    """
    sets = tuple(parse_cpu_list(getattr(cfg, name)) for name in CPU_FIELDS)
    if not any(sets):
        return sets
    if not hasattr(os, "sched_setaffinity"):
        raise UserError("trainer_cpus/server_cpus/controller_cpus: CPU pinning needs Linux (os.sched_setaffinity)")
    allowed = os.sched_getaffinity(0)
    for name, cpus in zip(CPU_FIELDS, sets):
        if cpus - allowed:
            raise UserError(f"field '{name}': cpu(s) {sorted(cpus - allowed)} not available "
                            f"(this process may use {sorted(allowed)})")
    return sets


@dataclass
class RunContext:
    """Everything a running job holds: config, output dir, task, tokenizer, trainer group, client, servers."""

    cfg: TrainConfig
    out: Path
    task: Any
    tokenizer: Any
    trainer: TrainerGroup
    client: RolloutClient
    fleet: Fleet
    reward_pool: RewardPool
    eval_items: list[PromptItem]
    status: RunStatus
    t0: float
    timeline: Timeline | None = None
    rollout_process: RolloutProcess | None = None  # the controller in its own process (rollout_process: true)

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
        record_timeline: also write ``timeline.json`` (:class:`Timeline`) for throughput accounting.
        resume: continue the run in ``out`` from this verified checkpoint (see :func:`resume_training`).
    Raises:
        UserError: unknown task, existing run directory, bad model path, or unavailable pinned cpus.
    """
    task = registry.get_task(cfg.task, seed=cfg.seed)
    if cfg.model_path is not None and not (Path(cfg.model_path) / "config.json").is_file():
        raise UserError(f"model_path '{cfg.model_path}': not a model directory (no config.json)")
    _check_cpus(cfg)
    if resume is not None and record_timeline:
        raise UserError("a resumed run cannot record a timeline (areal bench runs are not resumed)")
    if resume is None:
        prepare_out_dir(out)
    torch.set_num_threads(cfg.torch_threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if resume is None:
        write_json_atomic(out / "config.json", cfg.to_dict())
    status = RunStatus(cfg, out, live=live)
    timeline = Timeline() if record_timeline else None
    with status:
        summary = asyncio.run(_run(cfg, out, task, status, timeline, resume))
    status.summary(summary)
    return summary


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


async def _run(cfg: TrainConfig, out: Path, task, status: RunStatus, timeline: Timeline | None = None,
               resume: Checkpoint | None = None) -> dict:
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer

    t0 = status.t0
    if cfg.model_path is not None:
        base = Path(cfg.model_path)
    elif resume is not None:
        base = out / "model" / "base"
    else:
        status.log("building the embedded tiny Qwen3 model and tokenizer")
        base = build_tiny_model(out / "model" / "base", seed=cfg.seed, corpus=task.tokenizer_corpus(),
                                vocab_size=cfg.model_vocab_size, hidden_size=cfg.model_hidden_size,
                                num_layers=cfg.model_num_layers)
    tokenizer = load_tokenizer(base)
    serve_dir, serve_version = base, 0
    if resume is not None:  # the servers restart with the checkpointed policy version
        serve_version = int(resume.state["version"])
        serve_dir = _restore_weights_dir(out, resume)
        status.log(f"resuming from {resume.path} (step {resume.step}, policy version {serve_version})")
    trainer_cpus, server_cpus, controller_cpus = _check_cpus(cfg)
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
    try:
        pool = RewardPool(task.reward_fn, n_workers=cfg.reward_workers, timeout_s=cfg.reward_timeout_s)
        engine_kwargs = dict(hf_model_dir=base, lr=cfg.sft_lr, weight_decay=cfg.weight_decay,
                             betas=(cfg.adam_beta1, cfg.adam_beta2), grad_clip=cfg.grad_clip, seed=cfg.seed)
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
        eval_items = [_prompt_item(tokenizer, p) for p in task.heldout(cfg.eval_n_prompts)]
        ctx = RunContext(cfg, out, task, tokenizer, trainer, client, fleet, pool, eval_items, status, t0, timeline,
                         remote)
        warm = await warm_start(ctx) if resume is None else resume.state["warm_start"]
        summary = await rl_loop(ctx, warm, resume)
    finally:
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
    write_json_atomic(out / "summary.json", summary)
    if timeline is not None:
        timeline.marks["t0"] = t0
        write_json_atomic(out / "timeline.json", timeline.to_dict())
    return summary


def launch_servers(cfg: TrainConfig, model_dir: Path, version: int, out: Path, log=print) -> Fleet:
    """Start (or find) the run's rollout servers, without waiting for them (:meth:`Fleet.wait_ready`).

    ``rollout_engine``: "embedded" -> ``n_servers`` embedded CPU servers; "sglang" -> ``n_servers`` real
    SGLang servers (``python -m sglang.launch_server``), server i on GPUs ``W + i*tp .. W + i*tp + tp-1``
    modulo the GPUs visible, W = trainer ranks (which hold GPUs 0..W-1); on one GPU everything shares it
    and ``weight_update_mode: xccl`` is then impossible (NCCL refuses two ranks on one device: use disk);
    "external" -> ``server_urls`` or ``$AREAL_LLM_SERVER_ADDRS`` (what ``areal launch`` gives the
    controller), nothing launched. Logs: ``out/logs/server{i}.log``.

    Raises:
        UserError: port in use, bad settings, no external URLs.
    """
    import shlex

    engine = cfg.rollout_engine
    common = dict(run_dir=out, seed=cfg.seed, weight_version=str(version), model_path=model_dir)
    if engine == "external":
        urls = [u.strip() for u in cfg.server_urls.split(",") if u.strip()] or None
        log(f"using running rollout servers: {', '.join(urls) if urls else '$AREAL_LLM_SERVER_ADDRS'}")
        # they were started elsewhere and should already answer: wait 2 minutes, not a model load's 10
        return launch_fleet(FleetSpec(engine="external", n_servers=0, urls=urls, run_dir=out,
                                      startup_timeout_s=120.0), wait=False)
    if engine == "embedded":
        log(f"starting {cfg.n_servers} embedded rollout server(s)")
        return launch_fleet(FleetSpec(engine="embedded", n_servers=cfg.n_servers,
                                      max_running_requests=cfg.server_max_running_requests,
                                      max_total_tokens=cfg.server_max_total_tokens, **common), wait=False)
    import importlib.util

    from areal_cli.rollout.sglang_launcher import sglang_args_from_config

    if importlib.util.find_spec("sglang") is None:
        raise UserError("rollout_engine: sglang: the 'sglang' package is not installed in this environment "
                        "(pip install 'sglang[all]', see benchmarks/gpu_smoke.sh), or use rollout_engine=embedded")
    tp = cfg.sglang_tp_size
    n_gpus = torch.cuda.device_count()
    first = cfg.trainer_world_size  # the trainer ranks hold GPUs 0..W-1 (LOCAL_RANK); servers take the next ones
    gpu_ids = [[(first + i * tp + j) % n_gpus for j in range(tp)] for i in range(cfg.n_servers)] if n_gpus else None
    template = sglang_args_from_config(
        str(model_dir), tp_size=tp, mem_fraction_static=cfg.sglang_mem_fraction_static,
        max_total_tokens=cfg.server_max_total_tokens, max_running_requests=cfg.server_max_running_requests,
        max_prompt_tokens=cfg.extra.get("max_prompt_tokens", 1024), max_new_tokens=cfg.max_new_tokens,
        dtype=cfg.sglang_dtype, seed=cfg.seed, weight_version=str(version),
        extra_args=shlex.split(cfg.sglang_extra_args))
    log(f"starting {cfg.n_servers} SGLang rollout server(s) (tp {tp}, GPUs {gpu_ids})")
    return launch_fleet(FleetSpec(engine="sglang", n_servers=cfg.n_servers, gpu_ids=gpu_ids, sglang=template,
                                  **common), wait=False)


def weight_sync_spec(cfg: TrainConfig, client: RolloutClient):
    """The :class:`~areal_cli.rollout.weight_sync.WeightSyncSpec` of ``weight_update_mode: xccl``: nccl when the
    trainer has CUDA, else gloo (our embedded server); servers on other hosts reach the head rank at the
    address of its interface that routes to them (resolved on that rank)."""
    from areal_cli.rollout.weight_sync import WeightSyncSpec

    from urllib.parse import urlsplit

    local = all(urlsplit(u).hostname in ("127.0.0.1", "localhost") for u in client.urls)
    return WeightSyncSpec(urls=tuple(client.urls), backend="nccl" if torch.cuda.is_available() else "gloo",
                          master_address="127.0.0.1" if local else "auto", chunk_mb=cfg.weight_update_chunk_mb, server_tp=cfg.sglang_tp_size if
                          cfg.rollout_engine == "sglang" else 1, abort_all_requests=client.interruptible)


async def start_trainer(cfg: TrainConfig, engine_kwargs: dict, out: Path, cpus: frozenset[int],
                        log=None) -> TrainerGroup:
    """The run's trainer: :class:`LocalTrainer` (world 1, today's trainer thread pinned to ``cpus``), else
    ``world = trainer_data_parallel x trainer_tensor_parallel x trainer_pipeline_parallel`` torchrun ranks on
    this machine, or -- with ``$AREAL_CONTROLLER_LISTEN=host:port`` (and ``$AREAL_CONTROLLER_AUTHKEY_FILE``)
    -- ranks launched elsewhere that connect there (multi-node).

    Raises:
        UserError / TrainerError: the group did not start (log tails of the ranks in the message).
    """
    tp, pp = cfg.trainer_tensor_parallel, cfg.trainer_pipeline_parallel
    world = cfg.trainer_world_size
    listen = os.environ.get(ENV_LISTEN)
    if listen:
        if log is not None:
            log(f"waiting for {world} trainer rank(s) to connect on {listen}")
        return await TorchrunTrainer.attach(listen, engine_kwargs, authkey_file=os.environ.get(ENV_AUTHKEY_FILE),
                                            tp=tp, pp=pp, log_dir=out / "logs")
    if world == 1:
        return await LocalTrainer.launch(engine_kwargs, cpus=cpus or None)
    if log is not None:
        log(f"starting {world} trainer ranks with torchrun (data {cfg.trainer_data_parallel} x tensor {tp} x "
            f"pipeline {pp}); logs in {out / 'logs'}/trainer-rank*.log")
    return await TorchrunTrainer.launch(engine_kwargs, world=world, tp=tp, pp=pp, run_dir=out, cpus=cpus or None,
                                        torch_threads=cfg.torch_threads)


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


def _prompt_item(tokenizer, problem) -> PromptItem:
    from areal_cli.models.tiny import chat_prompt_ids

    return PromptItem(problem.id, chat_prompt_ids(tokenizer, problem.prompt), problem.answer)


# --------------------------------------------------------------------------------------------------
# Held-out accuracy
# --------------------------------------------------------------------------------------------------
async def evaluate(ctx: RunContext) -> float:
    """Greedy held-out accuracy in [0, 1] through the rollout servers (rewards scored in the pool).

    Raises:
        RuntimeError: a held-out reward call failed (error or timeout).
    """
    params = SamplingParams(max_new_tokens=ctx.cfg.max_new_tokens, temperature=0.0)
    comps = await asyncio.gather(*(ctx.client.generate(it.prompt_ids, params, rid=f"eval-{it.prompt_id}-{time.monotonic_ns()}")
                                   for it in ctx.eval_items))
    texts = [ctx.tokenizer.decode(c.output_ids, skip_special_tokens=True) for c in comps]
    results = await asyncio.gather(*(ctx.reward_pool.score(t, it.answer) for t, it in zip(texts, ctx.eval_items)))
    failed = [r for r in results if r.status != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} held-out rewards failed, e.g. {failed[0].status}: {failed[0].message}")
    return sum(r.reward > 0 for r in results) / len(results)


async def _load_version(ctx: RunContext, controller: RolloutController, path: Path, version: int) -> None:
    """Load published weights on every server, then let the controller admit rollouts of ``version``."""
    await ctx.client.update_weights_from_disk(str(path.resolve()), version)
    controller.notify_version(version)


async def _sync_distributed(ctx: RunContext, version: int) -> None:
    """``weight_update_mode: xccl``: every trainer rank gathers the HF weights, rank 0 broadcasts them to the
    servers in buckets (:func:`areal_cli.rollout.weight_sync.sync_weights_from_engine`), around a pause of the
    servers (interruptible) or a hold of new submissions (non-interruptible)."""
    from areal_cli.rollout.weight_sync import update_weights_distributed

    spec = weight_sync_spec(ctx.cfg, ctx.client)
    await update_weights_distributed(
        ctx.client, lambda: ctx.train("areal_cli.rollout.weight_sync:sync_weights_from_engine", spec, version),
        version)


async def publish(ctx: RunContext, version: int, tag: str) -> Path:
    """Write the trainer's weights in HF format and load them on every server as ``version``."""
    path = await ctx.train("engine.save_hf", ctx.out / "weights" / tag)
    await ctx.client.update_weights_from_disk(str(path.resolve()), version)
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
    if cfg.sft_max_steps > 0 and acc < cfg.sft_stop_accuracy:
        examples = ctx.task.sft_examples(cfg.sft_n_examples)
        eos = ctx.tokenizer.convert_tokens_to_ids("<|im_end|>")
        encoded = [(_prompt_item(ctx.tokenizer, p).prompt_ids,
                    ctx.tokenizer.encode(target, add_special_tokens=False) + [eos]) for p, target in examples]
        sft_cfg = SftConfig.from_train_config(cfg)
        try:  # checked here (the stage itself lives in the trainer)
            SftStage(None, encoded, sft_cfg, pad_id=ctx.tokenizer.pad_token_id)
        except ValueError as e:
            raise UserError(f"config: fields 'sft_*': {e}") from None
        await ctx.train("areal_cli.train_loop:sft_begin", encoded, sft_cfg, ctx.tokenizer.pad_token_id)
    while step < cfg.sft_max_steps and acc < cfg.sft_stop_accuracy:
        # weights evaluated below the stop accuracy: where to roll back to if the next eval overshoots 0.5
        await ctx.train("areal_cli.train_loop:keep_weights")
        kept_state, kept_step = True, step
        for _ in range(min(cfg.sft_eval_every, cfg.sft_max_steps - step)):
            stats = await ctx.train("areal_cli.train_loop:sft_step")
            step += 1
        await publish(ctx, 0, f"sft-step{step}")
        acc = await evaluate(ctx)
        ctx.status.phase("warm start", step=step, acc=acc, loss=stats["loss"])
    if cfg.sft_max_steps > 0 and kept_state is not None:
        await ctx.train("areal_cli.train_loop:sft_end", rollback=acc > 0.5)
    if acc > 0.5 and kept_state is not None:
        ctx.status.log(f"warm start overshot ({acc:.3f} > 0.5): rolling back to step {kept_step}")
        step = kept_step
        await publish(ctx, 0, f"sft-step{step}")
        acc = await evaluate(ctx)
    for p in (ctx.out / "weights").glob("sft-step*"):
        if p.name != f"sft-step{step}":
            shutil.rmtree(p, ignore_errors=True)
    return {"steps": step, "accuracy": acc, "seconds": time.monotonic() - t_start}


# Trainer-side functions of the warm start (run on every trainer rank, see areal_cli.trainer.group): the SFT
# stage and the rollback copy of the weights live in the trainer, keyed by its engine.
_TRAINER_STATE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def sft_begin(engine, examples: list, sft_cfg, pad_id: int) -> None:
    """Create the warm start's :class:`~areal_cli.sft.SftStage` on ``engine`` (trainer side)."""
    from areal_cli.sft import SftStage

    _TRAINER_STATE.setdefault(engine, {})["sft"] = SftStage(engine, examples, sft_cfg, pad_id=pad_id)


def sft_step(engine) -> dict[str, float]:
    """One SFT optimiser step of the stage made by :func:`sft_begin` (trainer side)."""
    return _TRAINER_STATE[engine]["sft"].step()


def keep_weights(engine) -> None:
    """Keep a copy of this rank's weights (the warm start's rollback point; trainer side)."""
    _TRAINER_STATE.setdefault(engine, {})["kept"] = {
        k: v.clone() for k, v in engine.model.state_dict().items() if "_extra_state" not in k}


def sft_end(engine, rollback: bool) -> None:
    """End the warm start: with ``rollback``, load the weights kept by :func:`keep_weights`; drop the stage."""
    st = _TRAINER_STATE.pop(engine, {})
    if rollback:
        engine.model.load_state_dict(st["kept"], strict=False)


# --------------------------------------------------------------------------------------------------
# Phase 2: asynchronous RL
# --------------------------------------------------------------------------------------------------
def _cpu_snapshot(ctx: RunContext) -> dict:
    """{"t": monotonic s, "trainer_process": CPU s of this process, "server<i>": CPU s of server i,
    "trainer_rank<r>": CPU s of torchrun trainer rank r (when the trainer is a group on this machine)}."""
    snap = {"t": time.monotonic(), "trainer_process": process_cpu_seconds(os.getpid())}
    if isinstance(ctx.trainer, TorchrunTrainer):  # its ranks on this machine
        for r, pid in enumerate(ctx.trainer.pids):
            snap[f"trainer_rank{r}"] = process_cpu_seconds(pid)
    if ctx.rollout_process is not None:
        snap["rollout_process"] = process_cpu_seconds(ctx.rollout_process.pid)
    for i, p in enumerate(ctx.fleet.procs):
        snap[f"server{i}"] = process_cpu_seconds(p.pid)
    return snap


def make_controller(cfg: TrainConfig, client: RolloutClient, reward_pool, tokenizer, task,
                    prompts=None) -> RolloutController:
    """The rollout controller of a run: the task's training prompts (or ``prompts``, e.g. a
    :class:`~areal_cli.checkpoint.PromptStream`), the staleness rule of ``cfg``."""
    staleness = StalenessManager(cfg.batch_size, cfg.max_head_offpolicyness, cfg.effective_max_concurrent)
    train_items = prompts if prompts is not None else (_prompt_item(tokenizer, p) for p in task.train_stream())
    return RolloutController(
        client, staleness, train_items, reward_pool,
        lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        group_size=cfg.group_size,
        sampling=SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p),
        success_rate_lb=cfg.success_rate_lb, success_rate_ub=cfg.success_rate_ub,
    )


def make_train_batch(groups: list[Group], cfg: TrainConfig, pad_id: int) -> TrainBatch:
    """Pack groups into a right-padded TrainBatch with per-token advantages.

    Advantages: group normalisation (GRPO) of the 0/1 rewards, or rewards broadcast to tokens and
    normalised over all valid tokens of the batch (``adv_norm = global``).
    """
    samples = [s for g in groups for s in g.samples]
    batch = build_train_batch(
        [(s.prompt_ids, s.output_ids, s.behaviour_logprobs, s.versions) for s in samples], pad_id=pad_id
    )
    rewards = torch.tensor([[s.reward for s in g.samples] for g in groups], dtype=torch.float32)
    if cfg.adv_norm == "group":
        adv = broadcast_to_tokens(group_normalized_advantages(rewards).flatten(), batch.loss_mask)
    else:
        adv = global_normalized_token_advantages(broadcast_to_tokens(rewards.flatten(), batch.loss_mask), batch.loss_mask)
    batch.advantages = adv
    return batch


def train_on_groups(engine, groups: list[Group], cfg: TrainConfig, pad_id: int) -> dict[str, float]:
    """One RL training step in the trainer: :func:`make_train_batch` then :func:`ppo_update` (run on every rank
    with the same groups). Returns ppo_update's stats plus ``tokens`` (prompt + response tokens of the batch),
    ``response_tokens`` and ``batch_s`` (seconds building the batch)."""
    t0 = time.monotonic()
    batch = make_train_batch(groups, cfg, pad_id)
    batch_s = time.monotonic() - t0
    stats = ppo_update(engine, batch, cfg)
    return {**stats, "tokens": float(batch.attention_mask.sum()), "response_tokens": float(batch.loss_mask.sum()),
            "batch_s": batch_s}


def save_trainer_checkpoint(engine, run_dir: Path, step: int, *, hf_dir: Path, rng: dict, state: dict,
                            keep: int) -> Path | None:
    """:func:`~areal_cli.checkpoint.save_checkpoint` with the engine's optimizer state, written by global rank 0
    only (data-parallel replicas hold the same state; config refuses checkpoints with model parallelism)."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return save_checkpoint(run_dir, step, hf_dir=hf_dir, optimizer_state=engine.optimizer.state_dict(), rng=rng,
                           state=state, keep=keep)


def ppo_update(engine, batch: TrainBatch, cfg: TrainConfig) -> dict[str, float]:
    """Recompute proximal logprobs, then one decoupled-PPO optimiser step per minibatch (runs in a thread).

    Returns loss, grad_norm, clip_frac, iw_capped_frac and ``cpu_s``: CPU seconds of the calling thread
    (compared with wall time it shows whether the trainer had its core to itself).
    """
    cpu0 = time.thread_time()
    if cfg.recompute_proximal:
        batch.proximal_logprobs = engine.logprobs(batch, temperature=cfg.temperature) * batch.loss_mask
    else:
        batch.proximal_logprobs = batch.behaviour_logprobs.clone()
    loss_cfg = DecoupledPPOConfig(cfg.eps_clip, cfg.behav_imp_weight_cap)
    totals: dict[str, float] = {"n_tokens": 0.0, "n_clipped": 0.0, "n_iw_capped": 0.0}
    out: dict[str, float] = {}
    for mb in batch.split(cfg.ppo_n_minibatches):
        n_valid = max(mb.n_loss_tokens, 1)

        def loss_fn(lp: torch.Tensor, m: TrainBatch) -> torch.Tensor:
            loss, st = decoupled_ppo_loss(lp, m.proximal_logprobs, m.behaviour_logprobs, m.advantages,
                                          m.loss_mask, n_valid, loss_cfg)
            for k in totals:
                totals[k] += st[k]
            return loss

        out = engine.train_step([mb], loss_fn, temperature=cfg.temperature)
    _sum_over_data_parallel(totals)
    n = max(totals["n_tokens"], 1.0)
    return {"loss": out["loss"], "grad_norm": out["grad_norm"], "clip_frac": totals["n_clipped"] / n,
            "iw_capped_frac": totals["n_iw_capped"] / n, "cpu_s": time.thread_time() - cpu0}


def _sum_over_data_parallel(totals: dict[str, float]) -> None:
    """Sum the loss-function counters over data-parallel ranks, in place (no-op in one process).

    Each rank counts the rows its ``loss_fn`` saw: its share when the engine splits the batch, all of it when
    it does not; fractions ``n_x / n_tokens`` are the global ones either way."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    from megatron.core import parallel_state as ps

    if ps.get_data_parallel_world_size() == 1:
        return
    keys = sorted(totals)
    t = torch.tensor([totals[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, group=ps.get_data_parallel_group())
    for k, v in zip(keys, t.tolist()):
        totals[k] = v


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
    stream = PromptStream(ctx.task.train_stream(), lambda p: _prompt_item(ctx.tokenizer, p),
                          **(rs["data"] if rs else {}))
    if ctx.rollout_process is not None:
        controller = ctx.rollout_process
        await controller.wait_ready()
    else:
        controller = make_controller(cfg, ctx.client, ctx.reward_pool, ctx.tokenizer, ctx.task, prompts=stream)
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
    with metrics_path.open("a" if rs else "w") as mf:
        if rs is None:
            first = {"step": 0, "version": 0, "phase": "warm_start_end", "reward_mean": None, "accuracy": acc,
                     "staleness_max": 0, "staleness_mean": 0.0, "elapsed_s": round(ctx.elapsed(), 3),
                     "rl_elapsed_s": 0.0, "warm_start_steps": warm["steps"],
                     "warm_start_s": round(warm["seconds"], 3)}
            mf.write(json.dumps(first) + "\n")
            mf.flush()
            ctx.status.step(first, controller.stats.as_dict())
        controller.start()
        loading: asyncio.Task | None = None  # the servers loading the latest version
        try:
            last_t = time.monotonic()
            for step in range(first_step, cfg.max_steps + 1):
                t_wait = time.monotonic()
                groups = await controller.get_batch(cfg.batch_size)
                t_batch = time.monotonic()
                wait_s = t_batch - t_wait
                train_stats = await ctx.train("areal_cli.train_loop:train_on_groups", groups, cfg,
                                              ctx.tokenizer.pad_token_id)
                train_cpu_s = train_stats.pop("cpu_s")
                n_tokens, n_response = int(train_stats.pop("tokens")), int(train_stats.pop("response_tokens"))
                train_s = time.monotonic() - t_batch - train_stats.pop("batch_s")  # the PPO update
                trained_tokens += n_tokens
                samples = [s for g in groups for s in g.samples]
                stale = [version - s.head_version for s in samples if s.versions]
                version += 1
                t_sync = time.monotonic()
                if loading is not None:  # the servers finish loading the previous version first
                    await loading
                    loading = None
                path = ctx.out / "weights" / f"v{version}"
                keep_copy = step == cfg.max_steps or bool(cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
                if cfg.weight_update_mode == "xccl":  # broadcast from the trainer; servers paused meanwhile
                    await _sync_distributed(ctx, version)
                    controller.notify_version(version)
                    if keep_copy:  # the final weights and checkpoints still go to disk
                        await ctx.train("engine.save_hf", path)
                else:
                    await ctx.train("engine.save_hf", path)
                    # The servers load it while the trainer goes on with the next batch (already generated
                    # under the staleness bound); rollouts of the new version are admitted once it is loaded.
                    loading = asyncio.create_task(_load_version(ctx, controller, path, version))
                eval_due = bool(cfg.eval_every) and (step % cfg.eval_every == 0 or step == cfg.max_steps)
                if (eval_due or step == cfg.max_steps) and loading is not None:
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
                now = time.monotonic()
                if tl is not None:
                    for kind, a, b in (("wait", t_wait, t_batch), ("train", t_batch, t_sync),
                                       ("publish", t_sync, t_published), ("eval", t_published, now)):
                        if b > a and (kind != "eval" or eval_due):
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
                line = {
                    "step": step, "version": version, "phase": "rl",
                    "reward_mean": sum(s.reward for s in samples) / len(samples),
                    "accuracy": acc,
                    "staleness_max": max(stale, default=0), "staleness_mean": sum(stale) / max(len(stale), 1),
                    "elapsed_s": round(ctx.elapsed(), 3), "rl_elapsed_s": round(now - t_rl, 3),
                    "gen_tokens_per_s": (cs["tokens_generated"] - last_tokens) / max(now - last_t, 1e-9),
                    "train_tokens_per_s": trained_tokens / max(now - t_rl, 1e-9),
                    "wait_s": round(wait_s, 4), "train_s": round(train_s, 4), "sync_s": round(sync_s, 4),
                    "groups_dropped": cs["groups_dropped_filter"] + cs["groups_dropped_reward_failure"],
                    "truncated_frac": sum(s.finish_reason == "length" for s in samples) / len(samples),
                    **{k: round(v, 6) for k, v in train_stats.items()}, **cs,
                }
                if rs is not None and step == first_step:
                    line["resumed_from"] = str(resume.path.relative_to(ctx.out))
                last_tokens, last_t = cs["tokens_generated"], now
                mf.write(json.dumps(line) + "\n")
                mf.flush()
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
                    ck = await ctx.train("areal_cli.train_loop:save_trainer_checkpoint", ctx.out, step, hf_dir=path,
                                         rng=rng, state=state, keep=cfg.keep_checkpoints)
                    ctx.status.log(f"checkpoint {ck.relative_to(ctx.out)} ({time.monotonic() - t_ck:.2f} s)")
                if time_to_target is None and cfg.target_accuracy and acc >= cfg.target_accuracy:
                    time_to_target = {"step": step, "elapsed_s": line["elapsed_s"], "rl_elapsed_s": line["rl_elapsed_s"]}
                    break
                if cfg.time_limit_s and ctx.elapsed() > cfg.time_limit_s:
                    ctx.status.log(f"time limit {cfg.time_limit_s}s reached")
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
            # also after Ctrl-C: the curve of the steps that were completed
            from areal_cli.plots import plot_learning_curve

            plot_learning_curve(metrics_path, ctx.out / "learning_curve.png", target=cfg.target_accuracy)
    final = ctx.out / "weights" / f"v{version}"
    summary = {
        "recipe": cfg.recipe, "ok": True, "final_version": version, "final_accuracy": acc,
        "target_accuracy": cfg.target_accuracy, "target_reached": time_to_target is not None,
        "warm_start": warm, "time_to_target": time_to_target, "elapsed_s": round(ctx.elapsed(), 3),
        "final_weights": str(final), "controller": controller.stats.as_dict(),
        "reward_failures": controller.stats.reward_failure_examples,
    }
    if resumes:
        summary["resumes"] = resumes
    return summary


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

