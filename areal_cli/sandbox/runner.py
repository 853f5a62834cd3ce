"""Run untrusted Python programs in the sandbox: the grader-side half (spawns and watches the harness).

One harness process per call runs every test of one program, each test in a fresh forked child
(see ``harness.py`` for the process layout and why). This module builds the job, enforces the total
time cap, streams per-test records to a callback (so a grader can stop at the first failure, as
LiveCodeBench does), and always cleans up: the harness's process group is killed, stragglers of its
session are swept, and the temporary directory is removed.

Isolation (``isolation=``, or the ``AREAL_SANDBOX_ISOLATION`` environment variable when ``"auto"``):

- ``"auto"`` (default): every layer the machine allows. With namespaces: pid/net/mount/ipc/uts namespaces,
  a minimal read-only root, an unprivileged uid (as root) or a capability-less user namespace (as a
  normal user). Without (a container that refuses ``unshare``): rlimits, a task cap, process group,
  scrubbed environment, the audit hook and, as root, an unprivileged uid; when that uid cannot reach the
  interpreter the run is refused (``SandboxError``), never run as root on the host.
- ``"strict"`` (``"namespaces"`` is the old name): refuse (``SandboxError``) unless the level is ``"full"``.
- ``"none"``: skip namespaces (everything else of the reduced set still applies). Used to test the
  fallback on machines that have namespaces.

Every run reports a level in ``isolation["level"]``: ``"full"`` (namespaces, a root of its own, an
identity without privileges, a task cap, the audit hook) or ``"reduced"``; :func:`describe_isolation`
says it in one line. Environment variables (read at each call):

- ``AREAL_SANDBOX_ISOLATION``: ``auto`` or ``strict``, the default for ``isolation="auto"``.
- ``AREAL_SANDBOX_PYTHON``: the interpreter that runs programs (same major.minor as this one; default this
  one). Set it to a Python that other users can read when this one lives under a private directory
  (``/root/.pyenv``) and the machine refuses namespaces.
- ``AREAL_SANDBOX_UID_RANGE``: ``LO-HI``, the uids a sandbox run as root may take (default
  ``16777216-1073741823``; one is drawn at random per run).
- ``AREAL_SANDBOX_REFUSE_NAMESPACES=1``: behave as if the kernel refused namespaces (what unprivileged
  Docker and Kubernetes pods do), to test that fallback on a machine that has them.

What each run reports is in :class:`RunResult` (:mod:`areal_cli.sandbox.results`); :func:`network_isolation`
says what this machine gives.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Literal, Sequence

import areal_cli.sandbox.host as host
from areal_cli.sandbox.limits import Limits
from areal_cli.sandbox.results import RunResult, SandboxError, SandboxRun, describe_isolation, result_from_record

Isolation = Literal["auto", "strict", "namespaces", "none"]
ISOLATION_CHOICES = ("auto", "strict", "namespaces", "none")

HARNESS = Path(__file__).with_name("harness.py")

# LiveCodeBench's ``import_string`` (lcb_runner/evaluation/testing_util.py), prepended to every program
# in both modes there: solutions may use e.g. ``List``, ``defaultdict``, ``stdin`` without importing them.
LCB_PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)

# Imported once by the harness before forking tests, so that the prelude costs a dict lookup per test.
_WARM_IMPORTS = (
    "import string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, "
    "functools, operator, io, json, typing, decimal, fractions, array, threading, atexit, traceback\n"
)

_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def read_roots() -> list[str]:
    """Host paths a sandboxed program may read (see :func:`areal_cli.sandbox.host.read_roots`)."""
    return host.read_roots()



def _free_uid(lo: int, hi: int) -> int:
    """A random uid in ``lo..hi`` that no account of this machine has (a program run as a real user, ``nobody``
    included, could reach that user's files and processes).

    Raises:
        SandboxError: the draws kept hitting accounts (a narrow ``AREAL_SANDBOX_UID_RANGE`` over real users).
    """
    import pwd

    rng = random.SystemRandom()
    for _ in range(32):
        uid = rng.randint(lo, hi)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise SandboxError(f"AREAL_SANDBOX_UID_RANGE={lo}-{hi}: its uids belong to accounts of this machine "
                       f"(e.g. {pwd.getpwuid(uid).pw_name}); give a range no account uses")


def _sweep_session(sid: int) -> None:
    """SIGKILL every process still in session ``sid`` (stragglers that left the harness's process group)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[3]) == sid:  # fields after "comm": state ppid pgrp session ...
                os.kill(int(name), signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            continue



def run_tests(
    source: str,
    tests: Sequence[str] | Sequence[list],
    *,
    fn_name: str | None = None,
    limits: Limits = Limits(),
    total_timeout_s: float = 60.0,
    prelude: str = LCB_PRELUDE,
    isolation: Isolation = "auto",
    on_result: Callable[[int, RunResult], bool] | None = None,
    probe_paths: Sequence[str] = (),
    audit_hook: bool = True,
) -> SandboxRun:
    """Run ``source`` once per test inside one sandbox, tests in order.

    Args:
        source: the program (Python 3).
        tests: stdin mode (``fn_name is None``): the stdin text of each run. Call-based mode: the positional
            arguments of each call (JSON-able lists).
        fn_name: None for stdin/stdout programs; else the function (or ``Solution`` method, when the source
            defines ``class Solution``, as LiveCodeBench decides) to call.
        limits: per-run limits (``limits.wall_s`` is the per-test timeout).
        total_timeout_s: cap on the whole call; tests not finished by then have no result.
        prelude: text prepended to the program (LiveCodeBench's imports by default).
        isolation: ``"auto"``, ``"strict"`` (old name ``"namespaces"``) or ``"none"`` (see the module
            docstring; ``"auto"`` follows ``AREAL_SANDBOX_ISOLATION``).
        on_result: called after each test with (index, result); return False to stop (the rest do not run).
        probe_paths: host paths whose visibility the harness reports in ``isolation["probe"]`` (tests and
            :func:`network_isolation` use this; it also turns on the network probe).
        audit_hook: install the in-process guard (default). ``False`` exists only so that tests can show
            what the operating-system layers contain on their own; never turn it off for real grading.
    Returns:
        a :class:`SandboxRun`.
    Raises:
        SandboxError: the harness could not start or set up, ``"strict"`` isolation is not available, an
            ``AREAL_SANDBOX_*`` variable is malformed, or (as root, without namespaces) no unprivileged uid
            can reach the interpreter. Never for program behaviour.
        ValueError: malformed arguments.
    """
    if isolation not in ISOLATION_CHOICES:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_CHOICES)}, got {isolation!r}")
    if fn_name is None and not all(isinstance(t, str) for t in tests):
        raise ValueError("stdin-mode tests must be strings")
    if fn_name is not None and not all(isinstance(t, list) for t in tests):
        raise ValueError("call-based tests must be lists of arguments")
    try:
        want = "strict" if isolation == "namespaces" else isolation
        if want == "auto":
            want = host.isolation_setting()
        interp = host.interpreter()
        lo, hi = host.uid_range()
    except host.HostConfigError as exc:
        raise SandboxError(str(exc)) from None
    roots = host.read_roots(interp)
    uid = _free_uid(lo, hi)
    tmp = tempfile.mkdtemp(prefix="areal-sandbox-")
    job = {
        "code": source,
        "mode": "stdin" if fn_name is None else "call",
        "fn_name": fn_name,
        "tests": list(tests),
        "prelude": prelude,
        "warm_imports": _WARM_IMPORTS,
        "limits": limits.to_job(),
        "isolation": want,
        "refuse_namespaces": host.refuse_namespaces(),
        "read_roots": roots,
        "sys_path": host.program_sys_path(interp, roots),
        "env": _ENV,
        "staging": os.path.join(tmp, "root"),
        "workdir": os.path.join(tmp, "work"),
        "uid": uid,
        "gid": uid,
        "probe": bool(probe_paths),
        "probe_paths": list(probe_paths),
        "audit_hook": bool(audit_hook),
    }
    run = SandboxRun()
    t0 = time.monotonic()
    proc = None
    try:
        os.chmod(tmp, 0o711)
        job["unreachable"] = host.unreachable([*roots, tmp])
        os.mkdir(job["staging"], 0o755)
        os.mkdir(job["workdir"], 0o700)
        with tempfile.TemporaryFile() as errfile:
            try:
                proc = subprocess.Popen(
                    [interp.executable, "-I", "-S", "-B", "-X", "utf8", str(HARNESS)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=errfile,
                    cwd=tmp,
                    env=dict(_ENV),
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise SandboxError(f"cannot start the sandbox harness: {exc}") from exc
            run.harness_pid = proc.pid
            try:
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            if _read_records(proc, run, len(job["tests"]), t0 + total_timeout_s, on_result):
                # Finished normally: let the harness exit by itself, so that its CPU time (and its
                # children's) is accounted to this process (RUSAGE_CHILDREN), as benchmarks read it.
                _wait_exit_unreaped(proc.pid, 2.0)
            errfile.seek(0)
            harness_err = errfile.read()[-2000:].decode("utf-8", "replace").strip()
        if run.setup_error is not None:
            raise SandboxError(f"sandbox setup failed: {run.setup_error}" + (f" ({harness_err})" if harness_err else ""))
        if not run.isolation and run.compile_error is None and not run.total_timed_out:
            raise SandboxError(f"sandbox harness exited without reporting: {harness_err or 'no message'}")
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            if not run.isolation.get("pid_ns"):
                _sweep_session(proc.pid)
            _kill_group(proc)
        shutil.rmtree(tmp, ignore_errors=True)
        run.wall_s = time.monotonic() - t0
    return run


def _wait_exit_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` has exited but leave it unreaped (a zombie keeps its pid, so the process-group
    kill and session sweep that follow cannot hit a process that reused the number). True if it exited."""
    deadline = time.monotonic() + timeout_s
    delay = 0.0005
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the harness's process group (it is a session leader: pgid == pid) and reap it.
    The caller sweeps the session before this reaps the harness."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
        pass
    if proc.stdout is not None:
        proc.stdout.close()


def _read_records(
    proc: subprocess.Popen,
    run: SandboxRun,
    n_tests: int,
    deadline: float,
    on_result: Callable[[int, RunResult], bool] | None,
) -> bool:
    """Read the harness's JSON lines until ``done``, an error, EOF, the deadline, or a stop request.
    Returns True only when the harness reported ``done``."""
    fd = proc.stdout.fileno()
    poller = select.poll()  # not select.select: it fails on fds >= 1024, common in a busy grader process
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            run.total_timed_out = True
            return False
        if not poller.poll(max(1, int(left * 1000))):
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            if len(run.results) < n_tests and run.compile_error is None and run.isolation:
                run.harness_died = True
            return False
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            rec = json.loads(line)
            event = rec.get("event")
            if event == "ready":
                run.isolation = rec["isolation"]
            elif event == "error":
                run.setup_error = rec["error"]
                return False
            elif event == "compile_error":
                run.compile_error = rec["error"]
                return True
            elif event == "done":
                return True
            elif event == "test":
                result = result_from_record(rec)
                run.results.append(result)
                if on_result is not None and not on_result(rec["i"], result):
                    run.stopped_early = True
                    return False


def run_python(
    source: str,
    *,
    stdin: str = "",
    limits: Limits = Limits(),
    isolation: Isolation = "auto",
    prelude: str = "",
) -> RunResult:
    """Run one program once with ``stdin`` as its input (no prelude by default).

    Returns:
        its :class:`RunResult`. A program that does not compile comes back with ``outcome="raised"``,
        ``returncode=1`` and the SyntaxError in ``error``.
    Raises:
        SandboxError: the sandbox could not run.
    """
    run = run_tests(
        source, [stdin], limits=limits, total_timeout_s=limits.wall_s + 30.0, prelude=prelude, isolation=isolation
    )
    if run.compile_error is not None:
        return RunResult(1, "", run.compile_error, False, None, 0.0, 0.0, 0, "raised", None, run.compile_error)
    if not run.results:
        raise SandboxError("the sandbox reported no result" + (" (total timeout)" if run.total_timed_out else ""))
    return run.results[0]


def network_isolation(isolation: Isolation = "auto") -> dict:
    """What isolation this machine gives a sandboxed program, checked by running the harness once.

    Returns:
        the harness's isolation report (``"level"``: ``"full"`` or ``"reduced"``) plus ``"summary"``
        (:func:`describe_isolation`), ``"network"``: ``"network namespace"`` (no route anywhere:
        only a downed loopback) or ``"audit hook only"`` (the fallback: the in-process guard refuses
        ``socket`` creation and name resolution; weaker, since native code could bypass it), and
        ``"probe"``: the interfaces seen and whether a route to the internet exists.
    """
    run = run_tests("", [], isolation=isolation, prelude="", probe_paths=[str(Path.home()), tempfile.gettempdir()])
    info = dict(run.isolation)
    info["summary"] = describe_isolation(info)
    probe = info.get("probe", {})
    no_route = probe.get("route_to_internet") is False
    info["network"] = "network namespace" if info.get("net_ns") and no_route else "audit hook only"
    return info
