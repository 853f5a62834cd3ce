"""RewardPool: run a reward function in worker processes with a hard per-call timeout.

Why processes and not threads: graders such as math-verify can hang forever inside sympy on some
inputs (towers of exponents) and cannot be interrupted from another thread; code graders run untrusted
code. A call that exceeds its time budget is ended by terminating the worker process, which is then
replaced, so the pool keeps serving. AReaL does the same with a Pebble ``ProcessPool`` (3 s timeout in
``evaluation/evaluate.py``; ``realhf/impl/dataset/math_parser.py``), but there a timeout silently becomes
"wrong". Here every call ends in exactly one of three statuses, and each is counted:

- ``"ok"``: the function returned; ``reward`` is its score as a float.
- ``"error"``: the function raised (message = ``"ExcType: message (raised at FILE:LINE in FUNCTION)"``, one line:
  the deepest frame of the user's own code), returned something that is
  not a score, or its worker process died (e.g. ``os._exit``, segfault, OOM kill).
- ``"timeout"``: no result within ``timeout_s`` seconds; the worker was killed and replaced.

The function is named by an importable ``"module:function"`` path so it can be loaded in a fresh
process (``spawn`` or ``forkserver`` start method; never ``fork``, which is unsafe with threads and
torch). Workers set ``OMP_NUM_THREADS=1`` before importing it and ``torch.set_num_threads(1)`` if torch
got imported, and ignore SIGINT (the parent owns shutdown).
"""

from __future__ import annotations

import asyncio
import importlib
import math
import multiprocessing
import os
import queue
import re
import signal
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

from areal_cli.foundations.errors import raised_at as _raised_at

Status = Literal["ok", "error", "timeout"]

_FN_PATH_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_MAX_MESSAGE_CHARS = 500


@dataclass(frozen=True)
class RewardResult:
    """Outcome of one reward call.

    Attributes:
        reward: the score as a float when ``status == "ok"``, else ``None`` (never a silent 0).
        status: ``"ok"``, ``"error"`` or ``"timeout"``.
        message: ``""`` when ok; otherwise one line saying what went wrong.
        value: the function's raw return value when ok (e.g. ``(extracted, correct)`` from
            :func:`areal_cli.reward.math_grader.grade`), else ``None``.
    """

    reward: float | None
    status: Status
    message: str = ""
    value: Any = None

    @property
    def ok(self) -> bool:
        """True when the call returned a score."""
        return self.status == "ok"


def one_line(exc: BaseException) -> str:
    """Format an exception as one line ``"ExcType: message"`` (newlines collapsed, <= 500 chars)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = " ".join(text.split())
    if len(text) > _MAX_MESSAGE_CHARS:
        text = text[: _MAX_MESSAGE_CHARS - 3] + "..."
    return text


def raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised (:func:`areal_cli.foundations.errors.raised_at`), this module's frames left out."""
    return _raised_at(exc, skip=(__file__,))


def validate_fn_path(fn: str) -> None:
    """Check that ``fn`` looks like ``"package.module:function"``.

    Raises:
        ValueError: when it does not (one line).
    """
    if not isinstance(fn, str) or not _FN_PATH_RE.match(fn):
        raise ValueError(f"reward function must be given as 'module:function', got {fn!r}")


def import_fn(fn: str) -> Callable[..., Any]:
    """Import the callable named by ``"module:function"`` (attribute chains like ``mod:Cls.meth`` allowed).

    Raises:
        ValueError: bad path format, or the attribute is not callable.
        ImportError / AttributeError: module or attribute missing.
    """
    validate_fn_path(fn)
    module_name, attr_path = fn.split(":", 1)
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{fn} is not callable")
    return obj


def to_reward(value: Any) -> float:
    """Convert a reward function's return value to a float score.

    Accepted: a real number or bool (``True`` -> 1.0), or a tuple/list whose LAST element is one
    (the convention of graders that also return details, e.g. ``(extracted_answer, correct)``).

    Raises:
        TypeError: anything else (the pool reports it as status ``"error"``).
        ValueError: NaN or infinite scores.
    """
    score = value
    if isinstance(value, (tuple, list)) and value:
        score = value[-1]
    if isinstance(score, bool):
        return 1.0 if score else 0.0
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        out = float(score)
        if not math.isfinite(out):
            raise ValueError(f"reward function returned a non-finite score {out!r}")
        return out
    # numpy scalars and 0-d tensors expose .item() without being int/float subclasses
    item = getattr(score, "item", None)
    if callable(item):
        try:
            return to_reward(item())
        except (TypeError, ValueError):
            pass
    raise TypeError(
        f"reward function returned {type(value).__name__}, expected a number, a bool, "
        "or a tuple whose last element is one"
    )


def _set_single_thread_torch() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.get_num_threads() != 1:
                torch.set_num_threads(1)
        except Exception:  # pragma: no cover - torch in a broken state is not our concern here
            pass


def _worker_main(conn: Any, default_fn: str) -> None:
    """Worker process loop: load ``default_fn``, say ready, then serve ``(fn_path, args)`` requests.

    Protocol on the duplex pipe: worker sends ``("ready", pid)`` or ``("init_error", message)`` once;
    then for each request ``(fn_path, args)`` it sends ``("ok", value)`` or ``("error", message)``.
    A ``None`` request (or a closed pipe) ends the loop.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    cache: dict[str, Callable[..., Any]] = {}
    try:
        cache[default_fn] = import_fn(default_fn)
    except BaseException as exc:  # noqa: BLE001 - report anything, including SystemExit at import
        conn.send(("init_error", one_line(exc)))
        return
    _set_single_thread_torch()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        fn_path, args = request
        try:
            fn = cache.get(fn_path)
            if fn is None:
                fn = cache[fn_path] = import_fn(fn_path)
                _set_single_thread_torch()
            reply: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - SystemExit from the fn is an error too
            reply = ("error", one_line(exc) + raised_at(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # unpicklable return value
            conn.send(("error", f"result could not be sent back: {one_line(exc)}"))


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, fn: str) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(
            target=_worker_main, args=(child_conn, fn), daemon=True, name="areal-reward-worker"
        )
        self.proc.start()
        child_conn.close()  # so that the parent sees EOF when the worker dies
        self.ready = False

    def wait_ready(self, timeout_s: float) -> str | None:
        """Block until the worker has loaded its function. Returns None when ready, else why not."""
        if self.ready:
            return None
        try:
            if not self.conn.poll(timeout_s):
                return f"worker did not start within {timeout_s:g} s"
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            return f"worker process died while starting ({self.exit_description()})"
        if kind == "ready":
            self.ready = True
            return None
        return str(payload)

    def exit_description(self) -> str:
        self.proc.join(timeout=2.0)
        code = self.proc.exitcode
        if code is None:
            return "exit code unknown"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def kill(self) -> None:
        """Terminate (SIGTERM, then SIGKILL after 2 s) and reap the process; close the pipe."""
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=2.0)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(timeout=2.0)
        else:
            self.proc.join(timeout=0.1)
        try:
            self.conn.close()
        except OSError:
            pass

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within 2 s."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=2.0)
        self.kill()


def _cleanup_workers(workers: list[_Worker]) -> None:
    for w in list(workers):
        try:
            w.kill()
        except Exception:
            pass


class RewardPool:
    """A pool of worker processes that run one reward function with a hard per-call timeout.

    Args:
        fn: the reward function as ``"module:function"``; it must be importable in a fresh process
            and its arguments/return value picklable. It returns a number, a bool, or a tuple whose
            last element is one (see :func:`to_reward`); the raw value is kept in ``RewardResult.value``.
        n_workers: number of worker processes (= calls that run at once). >= 1.
        timeout_s: wall-clock seconds one call may take, measured from when a worker starts it
            (time queued behind other calls does not count). > 0.
        startup_timeout_s: seconds a (re)started worker may take to import ``fn``.
        mp_context: ``"spawn"`` (default) or ``"forkserver"``.

    Raises:
        ValueError: bad arguments, or ``fn`` cannot be imported in a worker (one line, with the
            worker's error).

    Calls from several threads or several asyncio tasks at once are safe. Counters of outcomes are in
    :attr:`counters`. Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        fn: str,
        *,
        n_workers: int = 1,
        timeout_s: float = 5.0,
        startup_timeout_s: float = 120.0,
        mp_context: str = "spawn",
    ) -> None:
        validate_fn_path(fn)
        if not isinstance(n_workers, int) or n_workers < 1:
            raise ValueError(f"n_workers must be an integer >= 1, got {n_workers!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if mp_context not in ("spawn", "forkserver"):
            raise ValueError(f"mp_context must be 'spawn' or 'forkserver', got {mp_context!r}")
        self.fn = fn
        self.n_workers = n_workers
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self._ctx = multiprocessing.get_context(mp_context)
        self._lock = threading.Lock()
        self._counters = {"ok": 0, "error": 0, "timeout": 0}
        self._closed = False
        self._workers: list[_Worker] = []  # every live worker (for cleanup)
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._finalizer = weakref.finalize(self, _cleanup_workers, self._workers)
        try:
            for _ in range(n_workers):
                self._workers.append(_Worker(self._ctx, fn))
            for w in self._workers:
                problem = w.wait_ready(self.startup_timeout_s)
                if problem is not None:
                    raise ValueError(f"cannot load reward function '{fn}': {problem}")
                self._idle.put(w)
        except BaseException:
            _cleanup_workers(self._workers)
            self._closed = True
            raise
        self._executor = ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="reward-pool")

    # ------------------------------------------------------------------ public API
    @property
    def counters(self) -> dict[str, int]:
        """Number of calls that ended ``ok`` / ``error`` / ``timeout`` so far (a copy)."""
        with self._lock:
            return dict(self._counters)

    async def score(self, *args: Any) -> RewardResult:
        """Score one input with the pool's function: ``fn(*args)`` in a worker, with the hard timeout.

        Never raises for problems of the call itself: they come back as status error/timeout.

        Raises:
            RuntimeError: the pool is closed.
        """
        return await self.call(self.fn, *args)

    async def call(self, fn: str, *args: Any) -> RewardResult:
        """Like :meth:`score`, but run another importable ``"module:function"`` in the same workers
        (imported on first use in each worker; an import failure is a status ``"error"``)."""
        self._check_open()
        validate_fn_path(fn)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._call_blocking, fn, args)

    def score_many(self, args_list: Iterable[tuple[Any, ...]], *, fn: str | None = None) -> list[RewardResult]:
        """Score many inputs (each a tuple of positional args) using all workers; results in input order."""
        self._check_open()
        fn = fn or self.fn
        validate_fn_path(fn)
        return list(self._executor.map(lambda a: self._call_blocking(fn, tuple(a)), list(args_list)))

    def close(self) -> None:
        """Stop all workers (waits for calls in progress, at most their timeout). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        for w in list(self._workers):
            w.stop()
        self._workers.clear()
        self._finalizer.detach()

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("RewardPool is closed")

    def _count(self, result: RewardResult) -> RewardResult:
        with self._lock:
            self._counters[result.status] += 1
        return result

    def _replace(self, worker: _Worker) -> _Worker:
        """Kill ``worker`` and start a fresh one (not waited for: it gets ready in the background)."""
        worker.kill()
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
        fresh = _Worker(self._ctx, self.fn)
        with self._lock:
            self._workers.append(fresh)
        return fresh

    def _call_blocking(self, fn: str, args: tuple[Any, ...]) -> RewardResult:
        worker = self._idle.get()
        try:
            problem = worker.wait_ready(self.startup_timeout_s)
            if problem is not None:
                worker = self._replace(worker)
                return self._count(RewardResult(None, "error", f"reward worker failed to start: {problem}"))
            try:
                worker.conn.send((fn, args))
            except (BrokenPipeError, ConnectionResetError, EOFError):
                desc = worker.exit_description()
                worker = self._replace(worker)
                return self._count(RewardResult(None, "error", f"reward worker process died ({desc})"))
            except Exception as exc:  # arguments could not be pickled; the worker got nothing
                return self._count(RewardResult(None, "error", f"arguments could not be sent: {one_line(exc)}"))
            start = time.monotonic()
            try:
                has_reply = worker.conn.poll(self.timeout_s)
            except (EOFError, OSError):
                has_reply = True  # recv below reports the death
            if not has_reply:
                elapsed = time.monotonic() - start
                worker = self._replace(worker)
                return self._count(
                    RewardResult(
                        None,
                        "timeout",
                        f"no result within {self.timeout_s:g} s (waited {elapsed:.1f} s); "
                        "worker killed and replaced",
                    )
                )
            try:
                kind, payload = worker.conn.recv()
            except (EOFError, OSError):
                desc = worker.exit_description()
                worker = self._replace(worker)
                return self._count(RewardResult(None, "error", f"reward worker process died ({desc})"))
            if kind != "ok":
                return self._count(RewardResult(None, "error", str(payload)))
            try:
                reward = to_reward(payload)
            except (TypeError, ValueError) as exc:
                return self._count(RewardResult(None, "error", str(exc)))
            return self._count(RewardResult(reward, "ok", "", payload))
        finally:
            self._idle.put(worker)
