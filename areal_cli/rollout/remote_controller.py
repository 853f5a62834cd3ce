"""The rollout controller in its own process (``parallel.rollout_process: true``), as AReaL's rollout workers.

Why: in one process the controller's event loop (HTTP client, response parsing, reward dispatch) and the
trainer thread share the GIL. Measured here (tiny-arith, trainer thread on one core, a Python-busy thread on
the other): a PPO step that takes 0.25 s alone takes 0.31 s next to a thread busy 30% of the time, 0.44 s at
60% and 2.9 s at 100%. In its own process the controller runs beside the trainer instead of between its
Python calls.

:class:`RolloutProcess` offers what the training loop (``rl_loop``) uses of
:class:`~areal_cli.rollout.controller.RolloutController`: ``start()``, ``await get_batch(n)``,
``notify_version(v)``, ``await stop()`` and ``stats`` (``as_dict()``, ``tokens_generated``,
``reward_failure_examples``). The child builds its own tokenizer, reward pool, client and controller from
the run's config; accepted groups come back pickled over a pipe, and versions go to it after the servers
have loaded them, so the staleness rule is unchanged. The trainer's process keeps its own client for weight
updates and evaluation.

Pipe messages, child -> parent: ``("ready",)``, ``("group", Group, stats, activities)``, ``("stats", stats)`` (the
counters once a second: a trainer that waits while every group is dropped still sees them), ``("activities",
[(url, kind, start, end), ...])`` (a timeline's request activity, in bunches: with each group and once a second),
``("error", message)``, ``("stopped", stats, reward_failure_examples)``. Parent -> child: ``("start",)``,
``("version", v)``, ``("stale",)`` (a group was dropped at consumption: give its slot back), ``("stop",)``. The child exits when the pipe closes (parent gone).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from areal_cli.rollout.controller import too_stale


@dataclass
class RolloutSpec:
    """What the child needs (picklable): the run config, the tokenizer's model dir, server URLs."""

    cfg: Any  # TrainConfig
    model_dir: str
    urls: list[str]
    vocab_size: int
    cpus: frozenset[int] = frozenset()
    record_activity: bool = False


@dataclass
class RemoteStats:
    """The latest controller counters reported by the child (same keys as ``ControllerStats.as_dict``)."""

    counters: dict = field(default_factory=dict)
    reward_failure_examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.counters)

    @property
    def tokens_generated(self) -> int:
        return int(self.counters.get("tokens_generated", 0))


class RolloutProcess:
    """Parent-side handle on the rollout controller child process (see module docstring).

    Args:
        spec: the child's settings.
        on_activity: receives ``(url, kind, start, end)`` generation-activity intervals from the child's client
            (called on the event loop that called :meth:`wait_ready`).
    """

    def __init__(self, spec: RolloutSpec, on_activity: Callable[[str, str, float, float], None] | None = None):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child, spec), name="areal-rollout", daemon=False)
        self.proc.start()
        child.close()
        self.stats = RemoteStats()
        self._on_activity = on_activity
        self._eta = spec.cfg.rollout.max_head_offpolicyness
        self._groups: asyncio.Queue | None = None
        self._ready: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._error: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            try:
                self._conn.send(msg)
            except (BrokenPipeError, OSError):
                pass  # the child is gone; get_batch reports it

    def _dispatch(self, msg: tuple) -> None:  # on the event loop
        kind = msg[0]
        if kind == "group":
            self.stats.counters = msg[2]
            self._activities(msg[3])
            self._groups.put_nowait(msg[1])
        elif kind == "stats":
            self.stats.counters = msg[1]
        elif kind == "activities":
            self._activities(msg[1])
        elif kind == "ready":
            self._ready.set()
        elif kind == "error":
            self._error = msg[1]
        elif kind == "stopped":
            self.stats.counters, self.stats.reward_failure_examples = msg[1], msg[2]
            self._stopped.set()
        elif kind == "eof":
            self._error = self._error or f"rollout process exited (code {self.proc.exitcode})"
            self._ready.set()
            self._stopped.set()

    def _activities(self, events) -> None:
        if self._on_activity is not None:
            for ev in events:
                self._on_activity(*ev)

    def _read(self) -> None:  # reader thread: pipe -> event loop
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                msg = ("eof",)
            try:
                self._loop.call_soon_threadsafe(self._dispatch, msg)
            except RuntimeError:  # the loop is closed
                return
            if msg[0] == "eof":
                return

    async def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Wait until the child has built its controller.

        Raises:
            RuntimeError: the child failed or did not get ready in time.
        """
        self._loop = asyncio.get_running_loop()
        self._groups, self._ready, self._stopped = asyncio.Queue(), asyncio.Event(), asyncio.Event()
        self._reader = threading.Thread(target=self._read, name="rollout-pipe", daemon=True)
        self._reader.start()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except asyncio.TimeoutError:
            raise RuntimeError(f"rollout process not ready after {timeout_s:.0f} s") from None
        if self._error is not None:
            raise RuntimeError(f"rollout process failed: {self._error}")

    def start(self) -> None:
        """Start admitting groups."""
        self._send(("start",))

    def notify_version(self, version: int) -> None:
        """The servers serve ``version`` now: the child's staleness counter moves on."""
        self._send(("version", int(version)))

    async def get_batch(self, n_groups: int, consumer_version: int | None = None) -> list:
        """Wait for ``n_groups`` accepted groups, oldest first; with ``consumer_version`` a group more than eta
        versions older is dropped and the child gives its slot back, as :meth:`RolloutController.get_batch`.

        Raises:
            RuntimeError: the child reported an error or exited.
        """
        out: list = []
        while len(out) < n_groups:
            if self._error is not None:
                raise RuntimeError(f"rollout failed: {self._error}")
            try:
                group = await asyncio.wait_for(self._groups.get(), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            if consumer_version is not None and too_stale(group, consumer_version, self._eta):
                self._send(("stale",))
                continue
            out.append(group)
        return out

    async def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the child (its final counters land in :attr:`stats`), then end the process."""
        if self.proc.is_alive() and self._stopped is not None:
            self._send(("stop",))
            try:
                await asyncio.wait_for(self._stopped.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        self.close()

    def close(self) -> None:
        """End the child process (idempotent; also for a child that never got ready)."""
        if self.proc.is_alive():
            self._send(("stop",))
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self._conn.close()


# ----------------------------------------------------------------------------------------------------------
# Child process
# ----------------------------------------------------------------------------------------------------------


def _child_main(conn, spec: RolloutSpec) -> None:
    if spec.cpus:
        os.sched_setaffinity(0, spec.cpus)
    import torch

    torch.set_num_threads(1)
    try:
        asyncio.run(_child(conn, spec))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then the process ends
        try:
            conn.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
    finally:
        conn.close()


async def _child(conn, spec: RolloutSpec) -> None:
    from areal_cli.rollout.from_config import episode_client, make_controller, open_reward_pool, stop_token_ids
    from areal_cli.models.tiny import load_tokenizer
    from areal_cli.rollout.client import RolloutClient
    from areal_cli.tasks.task import Task

    cfg = spec.cfg
    lock = threading.Lock()

    def send(msg: tuple) -> None:
        with lock:
            conn.send(msg)

    loop = asyncio.get_running_loop()
    cmds: asyncio.Queue = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("stop",)
            loop.call_soon_threadsafe(cmds.put_nowait, msg)
            if msg[0] == "stop":
                return

    tokenizer = load_tokenizer(spec.model_dir)
    task = Task(cfg).bind(tokenizer)
    pool = open_reward_pool(cfg, task)
    # Timeline activity (requests in flight) travels in bunches: with each group, and every second when no group
    # goes out. One message per request woke the parent's reader thread and event loop hundreds of times per
    # step, beside the trainer thread and its GIL (a py-spy profile of an async tiny-arith run: the reader thread
    # in 13% of that process's samples; 9% in bunches).
    activities: list[tuple] = []

    def on_activity(url: str, kind: str, a: float, b: float) -> None:
        with lock:
            activities.append((url, kind, a, b))

    def take_activities() -> list[tuple]:
        with lock:
            out = activities[:]
            activities.clear()
        return out

    def flush_activities() -> None:
        batch = take_activities()
        if batch:
            send(("activities", batch))
    client = RolloutClient(spec.urls, vocab_size=spec.vocab_size, interruptible=cfg.rollout.interruptible,
                           pause_mode=cfg.rollout.pause_mode,
                           on_activity=on_activity if spec.record_activity else None)
    template = episode_client(cfg, client, pool, tokenizer, task, stop_token_ids(spec.model_dir, tokenizer))
    controller = make_controller(cfg, template, task, task.train_stream())
    threading.Thread(target=read, name="rollout-commands", daemon=True).start()
    send(("ready",))
    forward: asyncio.Task | None = None

    async def forward_groups() -> None:
        try:
            while True:
                (group,) = await controller.get_batch(1)
                send(("group", group, controller.stats.as_dict(), take_activities()))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - a failed group: the trainer raises it
            send(("error", str(e)))

    async def flush_activities_every(period_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period_s)
            flush_activities()

    async def report_stats_every(period_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                send(("stats", controller.stats.as_dict()))
            except OSError:  # the parent is gone: the command reader stops the child
                return

    flusher = asyncio.create_task(flush_activities_every()) if spec.record_activity else None
    reporter: asyncio.Task | None = None

    try:
        while True:
            msg = await cmds.get()
            if msg[0] == "start" and forward is None:
                controller.start()
                forward = asyncio.create_task(forward_groups())
                reporter = asyncio.create_task(report_stats_every())
            elif msg[0] == "version":
                client.set_weight_version(msg[1])  # the servers hold it: new requests use its cache namespace
                controller.notify_version(msg[1])
            elif msg[0] == "stale":
                controller.release_stale()
            elif msg[0] == "stop":
                break
    finally:
        for t in (forward, flusher, reporter):
            if t is not None:
                t.cancel()
                await asyncio.gather(t, return_exceptions=True)
        await controller.stop()
        await client.aclose()
        pool.close()
        try:
            flush_activities()
            send(("stopped", controller.stats.as_dict(), list(controller.stats.reward_failure_examples)))
        except OSError:
            pass
