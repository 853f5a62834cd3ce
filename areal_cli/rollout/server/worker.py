"""The engine thread of an embedded server, and the state the HTTP handlers share with it.

One background thread owns the :class:`~areal_cli.rollout.engine.InferenceEngine` and steps its running batch
(:class:`EngineWorker`); the HTTP handlers on the event loop talk to it through a command queue, and finished
requests come back through ``loop.call_soon_threadsafe`` (:class:`ServerState`). torch releases the GIL in its
kernels, so ``/health`` answers at once even while the engine computes.
"""

import argparse
import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

log = logging.getLogger("areal.rollout.server")


class EngineWorker:
    """Owns an :class:`InferenceEngine` in a background thread; everything else talks to it via commands.

    Results of finished requests are delivered to ``on_result(EngineResult)`` from the engine thread.

    Args:
        engine: the engine (only this thread touches it after :meth:`start`).
        on_result: callback for every finished/aborted request.
        step_delay_s: sleep after every step (tests use it to make generation slow enough to interrupt).
    """

    def __init__(self, engine, on_result: Callable[[Any], None], step_delay_s: float = 0.0):
        self.engine = engine
        self.on_result = on_result
        self.step_delay_s = float(step_delay_s)
        self.stepping_paused = False
        self._cmds: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.n_running = 0
        self.n_waiting = 0
        self.last_step_s = 0.0
        self.error: BaseException | None = None

    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the engine thread after the current step (waits up to 5 s)."""
        self._stop.set()
        self._cmds.put(None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def call(self, fn: Callable[[Any], Any]) -> Future:
        """Run ``fn(engine)`` on the engine thread between steps; returns a concurrent Future."""
        fut: Future = Future()
        self._cmds.put((fn, fut))
        return fut

    def busy(self) -> bool:
        """True while requests are running or queued inside the engine (read without locking)."""
        return self.n_running + self.n_waiting > 0 or not self._cmds.empty()

    def _run_cmd(self, item) -> None:
        fn, fut = item
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(self.engine))
        except BaseException as e:  # delivered to the awaiting handler
            fut.set_exception(e)

    def _loop(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            stepping = eng.has_work() and not self.stepping_paused
            try:  # idle: block on the queue; stepping: only pick up what is already there
                item = self._cmds.get_nowait() if stepping else self._cmds.get(timeout=0.5)
            except queue.Empty:
                item = _NOTHING
            while item is not _NOTHING:  # run every pending command before the next step
                if item is None:
                    self._stop.set()
                    break
                self._run_cmd(item)
                try:
                    item = self._cmds.get_nowait()
                except queue.Empty:
                    item = _NOTHING
            if self._stop.is_set():
                break
            if eng.has_work() and not self.stepping_paused:
                t0 = time.perf_counter()
                try:
                    results = eng.step()
                except Exception as e:  # a bug: fail every request instead of hanging them
                    log.exception("engine step failed")
                    self.error = e
                    results = eng.abort_all(message=f"engine error: {e!r}")
                self.last_step_s = time.perf_counter() - t0
                for r in results:
                    self.on_result(r)
                if self.step_delay_s:
                    time.sleep(self.step_delay_s)
            self.n_running, self.n_waiting = len(eng.running), len(eng.waiting)


_NOTHING = object()


class ServerState:
    """Everything the HTTP handlers share (lives on the event loop thread, except ``worker``)."""

    def __init__(self, engine, tokenizer, args: argparse.Namespace):
        self.engine = engine
        self.tokenizer = tokenizer
        self.args = args
        self.loop: asyncio.AbstractEventLoop | None = None
        self.waiters: dict[str, tuple[asyncio.Future, float]] = {}
        self.paused = False
        self.updating = 0
        self.unheld: asyncio.Event | None = None
        self.update_lock: asyncio.Lock | None = None
        self.worker = EngineWorker(engine, self.on_result, step_delay_s=args.step_delay_s)
        self.weight_groups: dict[str, Any] = {}  # group_name -> torch process group (weight sync)
        self.receiving: set[str] = set()  # groups a receive is blocked on
        self.weight_session = False  # between /begin_weight_update and /end_weight_update
        self.started = time.time()
        self.held_requests = 0  # /generate requests waiting for a pause (or a draining update) to end
        self.health_requests = 0  # GET /health calls received (the kit's own clients never make any)
        self.chat_tokenizer = None  # Hugging Face tokenizer with the chat template (/v1/chat/completions)

    def on_result(self, res) -> None:
        """Hand a finished (or aborted) request's EngineResult to the handler waiting for its rid, on the event
        loop (results arrive on the engine thread; safe from any thread)."""
        loop = self.loop
        if loop is None:
            return

        def deliver():
            item = self.waiters.pop(res.rid, None)
            if item is not None and not item[0].done():
                item[0].set_result(res)

        loop.call_soon_threadsafe(deliver)

    def held(self) -> bool:
        """True while new /generate requests must wait (paused, or an update waits for a drain)."""
        return self.paused or self.updating > 0

    def refresh_hold(self) -> None:
        """Set/clear the ``unheld`` event to match :meth:`held` (event-loop thread only)."""
        if self.held():
            self.unheld.clear()
        else:
            self.unheld.set()

    def decode(self, ids: list[int]) -> str:
        """Response ``text``: ids decoded without special tokens ("" without a tokenizer)."""
        if self.tokenizer is None or not ids:
            return ""
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except Exception:  # a tokenizer that cannot decode some id: text is informational only
            return ""

    def token_text(self, t: int) -> str:
        """Text of one token (third element of a logprob triple with return_text_in_logprobs)."""
        if self.tokenizer is None:
            return ""
        try:
            return self.tokenizer.decode([t], skip_special_tokens=False)
        except Exception:
            return ""
