"""Test process ``T`` of the in-sandbox harness (``harness.py``): runs the program once on one test.

``T`` is forked by ``N1`` for each test (see ``harness.py`` for the process layout). It redirects fds
0/1/2 to memory files (stdin holds the test input) and 3 to the result file, closes everything else, sets
its rlimits, installs the audit hook (:mod:`guard`), runs the program as ``__main__`` (stdin mode) or
imports it and calls the named function (call-based mode), and reports how it ended in the result file.
The prelude's names are computed once, before forking (:class:`Prelude`).

Stdlib only, like :mod:`guard` and :mod:`namespaces`: imported by the harness through its own directory
(run as a plain script by an isolated interpreter), then removed from ``sys.modules``; never imported by
the grader process.
"""

import builtins
import io
import json
import os
import resource
import signal
import sys
import types


def _posixsubprocess_stub() -> types.ModuleType:
    """Stands in for ``_posixsubprocess`` (whose ``fork_exec`` has no audit event): ``import subprocess``
    works, starting a process does not."""
    stub = types.ModuleType("_posixsubprocess")

    def fork_exec(*args, **kwargs):
        raise PermissionError("sandbox: starting processes is refused")

    stub.fork_exec = fork_exec
    return stub


def run_test(job: dict, code_obj, prelude, test, fds: tuple[int, int, int, int], read_roots: tuple,
             install_guard) -> None:
    """Test process T: run the compiled program ``code_obj`` on ``test`` (stdin text, or the call's arguments)
    with the prelude's names (:class:`Prelude`), fds ``(stdin, stdout, stderr, result)`` made 0-3, and
    report how it ended in fd 3. Never returns (exit status 71: the harness failed before the program ran)."""
    try:
        limits = job["limits"]
        os.setpgid(0, 0)
        job.pop("_set_pdeathsig")(signal.SIGKILL)  # die with the harness (matters without a pid namespace)
        in_fd, out_fd, err_fd, res_fd = fds
        os.dup2(in_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.dup2(res_fd, 3)
        os.closerange(4, 1 << 20)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="backslashreplace"
        )
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        cpu = int(limits["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_bytes"], limits["max_file_bytes"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"], limits["max_open_files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        module = types.ModuleType("__main__")
        prelude.apply(module.__dict__)
        module.__file__ = os.path.join(job["workdir"], "main.py")
        sys.modules["__main__"] = module
        sys.set_int_max_str_digits(0)
        import atexit
        import threading
        import traceback

        dumps = json.dumps
        pwrite = os.pwrite
        ftruncate = os.ftruncate
        exit_now = os._exit
        if job["audit_hook"]:
            sys.modules.pop("subprocess", None)  # would hold the real module
            sys.modules["_posixsubprocess"] = _posixsubprocess_stub()
            install_guard(job["workdir"], read_roots)
    except BaseException:  # the harness failed before the program ran: never a pass
        os._exit(71)

    def report(kind: str, **extra) -> None:
        data = dumps({"kind": kind, **extra}).encode()
        try:
            ftruncate(3, 0)
            pwrite(3, data, 0)
        except OSError:
            pass

    def flush() -> str | None:
        for stream in (sys.stdout, sys.__stdout__, sys.stderr):
            try:
                stream.flush()
            except BaseException as exc:  # e.g. OSError EFBIG past the file-size limit
                return f"{type(exc).__name__}: {exc}"
        return None

    def finish_like_interpreter() -> None:
        try:
            threading._shutdown()  # wait for non-daemon threads, as the interpreter does at exit
        except BaseException:
            pass
        try:
            atexit._run_exitfuncs()
        except BaseException:
            pass

    def error_line(exc: BaseException) -> str:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return " ".join(text.split())[:500]

    if job["mode"] == "stdin":
        kind, exit_code, error = "completed", 0, ""
        try:
            exec(code_obj, module.__dict__)
        except SystemExit as exc:
            kind = "system_exit"
            code = exc.code
            if code is None or isinstance(code, int):
                exit_code = code or 0
            else:
                print(code, file=sys.stderr)
                exit_code = 1
        except BaseException as exc:
            kind, exit_code, error = "raised", 1, error_line(exc)
            try:
                traceback.print_exc()
            except BaseException:
                pass
        finish_like_interpreter()
        flush_error = flush()
        if flush_error is not None and kind != "raised":
            kind, exit_code, error = "raised", 1, flush_error
        report(kind, exit_code=exit_code, error=error)
        exit_now(1 if kind == "raised" else 0)

    # call-based mode (LeetCode style), as LiveCodeBench's grade_call_based
    try:
        exec(code_obj, module.__dict__)
    except SystemExit:
        flush()
        report("exit_before_call")
        exit_now(0)
    except BaseException as exc:
        traceback.print_exc()
        flush()
        report("raised", stage="import", error=error_line(exc))
        exit_now(1)
    try:
        target = module.__dict__["Solution"]() if "class Solution" in job["code"] else module
        fn = getattr(target, job["fn_name"])
    except BaseException as exc:
        flush()
        report("missing_function", error=error_line(exc))
        exit_now(1)
    try:
        value = fn(*test)
    except SystemExit:
        flush()
        report("exit_during_call")
        exit_now(0)
    except BaseException as exc:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        flush()
        report("raised", stage="call", error=error_line(exc))
        exit_now(1)
    flush()
    try:
        value_json = dumps(value)
    except BaseException as exc:
        report("unserializable", error=error_line(exc))
        exit_now(1)
    report("returned", value_json=value_json)
    exit_now(0)


class Prelude:
    """The prelude's names, computed once in the harness instead of ``exec``-ed in every test.

    Equivalent to running it in each test (the modules are the same objects either way), except that the
    names live in the program's builtins rather than its globals: a forked test then touches only the
    names it uses. Copying ~500 names into each test's globals writes ~500 reference counts, and each
    write copies a shared page (~1.5 ms of a ~4 ms test). The program's own globals shadow them, as
    globals shadow builtins. ``sys.stdin``/``stdout``/``stderr`` differ per test, so the prelude runs
    against placeholders and the names bound to them (``stdin``, ``stdout``, ``stderr`` from
    ``from sys import *``) go into the test's globals. ``sys.setrecursionlimit`` and the like take effect
    here and are inherited through fork."""

    _STREAMS = ("stdin", "stdout", "stderr")

    def __init__(self, source: str) -> None:
        placeholders = {name: object() for name in self._STREAMS}
        saved = [getattr(sys, name) for name in self._STREAMS]
        names: dict = {"__name__": "__main__", "__builtins__": builtins}
        try:
            for name in self._STREAMS:
                setattr(sys, name, placeholders[name])
            exec(compile(source, "<prelude>", "exec", dont_inherit=True), names)
        finally:
            for name, stream in zip(self._STREAMS, saved):
                setattr(sys, name, stream)
        self.stream_names = [
            (key, stream) for key, value in names.items() for stream, ph in placeholders.items() if value is ph
        ]
        streams = {key for key, _ in self.stream_names}
        self.builtins = dict(builtins.__dict__)
        self.builtins.update({k: v for k, v in names.items() if not k.startswith("__") and k not in streams})

    def apply(self, namespace: dict) -> None:
        namespace["__builtins__"] = self.builtins
        for key, stream in self.stream_names:
            namespace[key] = getattr(sys, stream)
