"""The processes of a run and where they run: rollout servers (embedded, SGLang, external), the trainer
group (in-process or torchrun ranks), CPU pinning of each.

Used by :mod:`areal_cli.train_loop` and ``areal bench throughput``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from areal_cli.config import TrainConfig, get_value, parse_cpu_list
from areal_cli.foundations.errors import UserError
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.fleet import Fleet, FleetSpec, launch_fleet
from areal_cli.trainer.group import ENV_AUTHKEY_FILE, LocalTrainer, TorchrunTrainer, TrainerGroup

ENV_LISTEN = "AREAL_CONTROLLER_LISTEN"  # host:port: attach to externally launched trainer ranks (multi-node)


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Pin every thread of process ``pid`` (0 = this one) to ``cpus``; later threads inherit it."""
    task_dir = Path(f"/proc/{pid or os.getpid()}/task")
    tids = [int(t.name) for t in task_dir.iterdir()] if task_dir.is_dir() else [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            pass


CPU_FIELDS = ("parallel.trainer_cpus", "parallel.server_cpus", "parallel.controller_cpus")


def check_cpus(cfg: TrainConfig) -> tuple[frozenset[int], frozenset[int], frozenset[int]]:
    """The trainer, server and controller cpu sets of ``cfg``, checked against this process's cpus.

    Raises:
        UserError: a cpu outside this process's affinity, or pinning unsupported on this OS.
    """
    sets = tuple(parse_cpu_list(get_value(cfg, name)) for name in CPU_FIELDS)
    if not any(sets):
        return sets
    if not hasattr(os, "sched_setaffinity"):
        raise UserError("parallel.trainer_cpus/server_cpus/controller_cpus: CPU pinning needs Linux (os.sched_setaffinity)")
    allowed = os.sched_getaffinity(0)
    for name, cpus in zip(CPU_FIELDS, sets):
        if cpus - allowed:
            raise UserError(f"field '{name}': cpu(s) {sorted(cpus - allowed)} not available "
                            f"(this process may use {sorted(allowed)})")
    return sets


def launch_servers(cfg: TrainConfig, model_dir: Path, version: int, out: Path, log=print) -> Fleet:
    """Start (or find) the run's rollout servers, without waiting for them (:meth:`Fleet.wait_ready`).

    ``rollout.engine``: "embedded" -> ``rollout.n_servers`` embedded CPU servers; "sglang" -> ``rollout.n_servers`` real
    SGLang servers (``python -m sglang.launch_server``), server i on GPUs ``W + i*tp .. W + i*tp + tp-1``
    modulo the GPUs visible, W = trainer ranks (which hold GPUs 0..W-1); on one GPU everything shares it
    and ``rollout.weight_update_mode: xccl`` is then impossible (NCCL refuses two ranks on one device: use disk);
    "external" -> ``rollout.server_urls`` or ``$AREAL_LLM_SERVER_ADDRS`` (what ``areal launch`` gives the
    controller), nothing launched. Logs: ``out/logs/server{i}.log``.

    Raises:
        UserError: port in use, bad settings, no external URLs.
    """
    import shlex

    engine = cfg.rollout.engine
    common = dict(run_dir=out, seed=cfg.seed, weight_version=str(version), model_path=model_dir)
    if engine == "external":
        urls = [u.strip() for u in cfg.rollout.server_urls.split(",") if u.strip()] or None
        log(f"using running rollout servers: {', '.join(urls) if urls else '$AREAL_LLM_SERVER_ADDRS'}")
        # they were started elsewhere and should already answer: wait 2 minutes, not a model load's 10
        return launch_fleet(FleetSpec(engine="external", n_servers=0, urls=urls, run_dir=out,
                                      startup_timeout_s=120.0), wait=False)
    if engine == "embedded":
        log(f"starting {cfg.rollout.n_servers} embedded rollout server(s)")
        return launch_fleet(FleetSpec(engine="embedded", n_servers=cfg.rollout.n_servers,
                                      max_running_requests=cfg.rollout.server_max_running_requests,
                                      max_total_tokens=cfg.rollout.server_max_total_tokens, **common), wait=False)
    from areal_cli.rollout.sglang_env import resolve_sglang_python
    from areal_cli.rollout.sglang_launcher import CPU_ENV, cpu_mode, sglang_args_from_config

    python = resolve_sglang_python(cfg.rollout.sglang_python)
    tp = cfg.rollout.sglang_tp_size
    n_gpus = torch.cuda.device_count()
    first = cfg.parallel.world_size  # the trainer ranks hold GPUs 0..W-1 (LOCAL_RANK); servers take the next ones
    gpu_ids = [[(first + i * tp + j) % n_gpus for j in range(tp)] for i in range(cfg.rollout.n_servers)] if n_gpus else None
    template = sglang_args_from_config(
        str(model_dir), tp_size=tp, mem_fraction_static=cfg.rollout.sglang_mem_fraction_static,
        max_total_tokens=cfg.rollout.server_max_total_tokens or None, max_running_requests=cfg.rollout.server_max_running_requests or None,
        max_prompt_tokens=(cfg.rollout.sglang_context_length - cfg.rollout.max_new_tokens) if cfg.rollout.sglang_context_length
        else (cfg.task.max_prompt_len or 1024), max_new_tokens=cfg.rollout.max_new_tokens,
        dtype=cfg.rollout.sglang_dtype or "bfloat16", seed=cfg.seed, weight_version=str(version),
        # SGLang refuses min_new_tokens > 0 without its tokenizer (it needs the EOS id)
        skip_tokenizer_init=cfg.rollout.min_new_tokens == 0,
        # in-place updates: exact version spans (the overlap scheduler labels its in-flight forward's tokens new)
        disable_overlap_schedule=cfg.rollout.interruptible and cfg.rollout.pause_mode == "in_place",
        extra_args=shlex.split(cfg.rollout.sglang_extra_args))
    env = None
    if not n_gpus:  # SGLang's CPU mode (torch-native attention, float32 unless chosen, asleep when idle)
        template = cpu_mode(template, dtype_given=bool(cfg.rollout.sglang_dtype))
        env = dict(CPU_ENV)
    where = f"GPUs {gpu_ids}" if n_gpus else f"CPU mode, {template.dtype}"
    log(f"starting {cfg.rollout.n_servers} SGLang rollout server(s) (tp {tp}, {where}, {python})")
    return launch_fleet(FleetSpec(engine="sglang", n_servers=cfg.rollout.n_servers, gpu_ids=gpu_ids, sglang=template,
                                  python=python, env=env, **common), wait=False)


def weight_sync_spec(cfg: TrainConfig, client: RolloutClient):
    """The :class:`~areal_cli.rollout.weight_sync.WeightSyncSpec` of ``rollout.weight_update_mode: xccl``: nccl when the
    trainer has CUDA, else gloo (our embedded server); servers on other hosts reach the head rank at the
    address of its interface that routes to them (resolved on that rank)."""
    from areal_cli.rollout.weight_sync import WeightSyncSpec

    from urllib.parse import urlsplit

    local = all(urlsplit(u).hostname in ("127.0.0.1", "localhost") for u in client.urls)
    return WeightSyncSpec(urls=tuple(client.urls), backend="nccl" if torch.cuda.is_available() else "gloo",
                          master_address="127.0.0.1" if local else "auto", chunk_mb=cfg.rollout.weight_update_chunk_mb, server_tp=cfg.rollout.sglang_tp_size if
                          cfg.rollout.engine == "sglang" else 1, abort_all_requests=client.aborts_on_update,
                          flush_cache=not client.keeps_requests_on_update)


async def start_trainer(cfg: TrainConfig, engine_kwargs: dict, out: Path, cpus: frozenset[int],
                        log=None) -> TrainerGroup:
    """The run's trainer: :class:`LocalTrainer` (world 1, today's trainer thread pinned to ``cpus``), else
    ``world = parallel.data x parallel.tensor x parallel.pipeline`` torchrun ranks on
    this machine, or -- with ``$AREAL_CONTROLLER_LISTEN=host:port`` (and ``$AREAL_CONTROLLER_AUTHKEY_FILE``)
    -- ranks launched elsewhere that connect there (multi-node).

    Raises:
        UserError / TrainerError: the group did not start (log tails of the ranks in the message).
    """
    tp, pp = cfg.parallel.tensor, cfg.parallel.pipeline
    world = cfg.parallel.world_size
    listen = os.environ.get(ENV_LISTEN)
    if listen:
        if log is not None:
            log(f"waiting for {world} trainer rank(s) to connect on {listen}")
        return await TorchrunTrainer.attach(listen, engine_kwargs, authkey_file=os.environ.get(ENV_AUTHKEY_FILE),
                                            tp=tp, pp=pp, log_dir=out / "logs")
    if world == 1:
        return await LocalTrainer.launch(engine_kwargs, cpus=cpus or None)
    if log is not None:
        log(f"starting {world} trainer ranks with torchrun (data {cfg.parallel.data} x tensor {tp} x "
            f"pipeline {pp}); logs in {out / 'logs'}/trainer-rank*.log")
    return await TorchrunTrainer.launch(engine_kwargs, world=world, tp=tp, pp=pp, run_dir=out, cpus=cpus or None,
                                        torch_threads=cfg.parallel.torch_threads)
