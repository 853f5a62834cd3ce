"""In-sandbox harness: runs one program against a list of tests, each test in its own forked child.

Run by :mod:`areal_cli.sandbox.runner` as ``python -I -S -B -X utf8 harness.py`` (isolated interpreter: no
environment variables, no user site, no script directory on ``sys.path``), stdlib only. It reads one JSON
job from stdin and writes one JSON record per line to stdout. It never receives expected outputs: the
grader compares in its own process, so nothing a program does inside the sandbox can read or alter them.

Processes (why this shape: speed and containment):

- ``H0`` (this script's first process; its own session, made by the runner): reads the job, pre-imports the
  modules LiveCodeBench's prelude imports and evaluates the prelude once (:class:`child.Prelude`), compiles
  the program once, tries to unshare namespaces (:mod:`namespaces`), then forks ``N1`` and waits for it.
- ``N1`` (pid 1 of the new pid namespace when that worked): builds the minimal root, drops privileges,
  sets ``RLIMIT_NPROC``, forgets ctypes, and for each test forks a fresh child ``T`` from its warm state
  (a fork costs ~3 ms of CPU; a fresh interpreter ~15 ms, more with imports). It enforces the per-test wall-clock timeout from
  outside (``pidfd`` + ``poll``), kills ``T`` (and, as pid 1, every other process of the namespace) when it
  ends or overruns, reads ``T``'s stdout/stderr/result from memory files, and writes one record. A test
  has run only when ``N1`` writes its record; ``T`` cannot forge one (it closes ``N1``'s record pipe
  before the program runs, and ``N1`` is not dumpable, so ``/proc/N1/fd`` is closed to it).
- ``T`` (:mod:`child`): redirects fds 0/1/2 to memory files (stdin holds the test input), 3 to the result
  file, closes everything else, sets its rlimits (CPU, address space, file size, open files, no core),
  installs the audit hook (:mod:`guard`), and runs the program as ``__main__`` (stdin mode) or imports it
  and calls the named function (call-based mode), reporting how it ended in the result file.

Each process dies with its parent (``PR_SET_PDEATHSIG``, set again after the uid drop, which clears it),
so killing the grader takes the whole sandbox down; with a pid namespace the kernel also kills every
process in it when ``N1`` exits.

Records: ``{"event": "ready", "isolation": {...}}``, then ``{"event": "test", "i": ..., ...}`` per test,
then ``{"event": "done"}``; or ``{"event": "error", "error": "..."}`` (setup failed) and
``{"event": "compile_error", "error": "..."}``.
"""

import gc
import json
import os
import resource
import select
import signal
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_DEVICES = ["/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"]
_STDERR_TAIL = 4000


class Refused(Exception):
    """The sandbox will not run programs with what this machine gives it (the message says why, in one line)."""


def _write_record(fd: int, record: dict) -> None:
    data = (json.dumps(record) + "\n").encode()
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _memfd(name: str, data: bytes = b"") -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_memfd(fd: int, limit: int) -> tuple[bytes, bool]:
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, limit), 0) if size else b""
    return data, size > limit


def _count_user_tasks(uid: int) -> int:
    """Tasks (processes + threads) of ``uid``: ``RLIMIT_NPROC`` counts these per real uid."""
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid:
                n += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            continue
    return n


def _kernel_at_least(major: int, minor: int) -> bool:
    parts = os.uname().release.split(".")
    try:
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def _setup_isolation(job: dict, isolation: dict) -> None:
    """In N1: minimal root, privilege drop, process limit. Fills ``isolation`` with what took effect."""
    import namespaces  # noqa: PLC0415 (found through _HERE on sys.path; stdlib + ctypes only)

    limits = job["limits"]
    as_root = isolation["host_root"]
    uid, gid = job["uid"], job["gid"]
    if isolation["mount_ns"]:
        try:
            workdir = namespaces.build_root(
                job["staging"],
                job["read_roots"],
                _DEVICES,
                limits["work_bytes"],
                uid if as_root else 0,
                gid if as_root else 0,
            )
            isolation["fs_root"] = True
            job["workdir"] = workdir
        except OSError as exc:
            isolation["errors"].append(f"fs root: {exc}")
    if not isolation["fs_root"]:
        os.chdir(job["workdir"])
    if as_root and not isolation["fs_root"] and job.get("unreachable"):
        # Never run a program as root on the host: without a root of its own, an unprivileged uid must be
        # able to reach the interpreter, and here it cannot.
        raise Refused(
            f"the sandbox has no root of its own ({'; '.join(isolation['errors']) or 'namespaces not used'}) and, running as "
            f"root, the program must run as an unprivileged uid, which cannot reach what it needs "
            f"({job['unreachable']}): allow user and mount namespaces, run areal as a non-root user, or point "
            f"AREAL_SANDBOX_PYTHON (a Python {sys.version_info[0]}.{sys.version_info[1]}) and TMPDIR at places "
            "other users can read"
        )
    if as_root:
        if not isolation["fs_root"]:
            os.chown(job["workdir"], uid, gid)
        namespaces.drop_to_uid(uid, gid)
        isolation["user"] = f"uid {uid}"
    elif isolation["user_ns"]:
        try:
            namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
            namespaces.drop_capabilities()
            isolation["user"] = "user namespace, no capabilities"
        except OSError as exc:
            isolation["errors"].append(f"drop capabilities: {exc}")
    try:
        namespaces.prctl(namespaces.PR_SET_NO_NEW_PRIVS, 1)
        namespaces.prctl(namespaces.PR_SET_DUMPABLE, 0)
    except OSError as exc:
        isolation["errors"].append(f"prctl: {exc}")
    # RLIMIT_NPROC counts tasks (processes and threads) per real uid; root would be exempt, hence the drop above.
    max_procs = int(limits["max_procs"])
    if isolation["user"].startswith("uid") or (isolation["user_ns"] and _kernel_at_least(5, 14)):
        limit = max_procs  # a uid (or, since Linux 5.14, a user namespace) of this sandbox alone
    else:  # not root (root always has a uid of its own by now): a shared uid, so allow this many more
        limit = max_procs + job["user_tasks"]  # than it already runs
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    isolation["nproc_limit"] = limit
    isolation["level"] = _level(isolation)
    job["_set_pdeathsig"] = namespaces.parent_death_signal_setter()
    namespaces.forget_libc()
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
        del sys.modules[name]
    del sys.modules["namespaces"]


def _os_layers_complete(isolation: dict) -> bool:
    """pid, net and mount namespaces, a root of its own, an identity without privileges and a task cap."""
    return bool(
        isolation["pid_ns"]
        and isolation["net_ns"]
        and isolation["fs_root"]
        and isolation["user"] != "unchanged"
        and isolation["nproc_limit"] is not None
    )


def _level(isolation: dict) -> str:
    """``"full"``: every operating-system layer and the audit hook. ``"reduced"``: anything less (the program
    never runs as the host's root even then)."""
    return "full" if _os_layers_complete(isolation) and isolation["guard"] else "reduced"


def _probe(job: dict, isolation: dict) -> None:
    """Trusted checks of what the sandbox sees (no untrusted code): network interfaces, host paths."""
    import socket

    probe: dict = {}
    try:
        probe["interfaces"] = sorted(name for _, name in socket.if_nameindex())
    except OSError as exc:
        probe["interfaces"] = f"error: {exc}"
    # A UDP connect() only looks up a route (no packet is sent): it tells whether any network is reachable.
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737)
        probe["route_to_internet"] = True
    except OSError as exc:
        probe["route_to_internet"] = False
        probe["route_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        udp.close()
    probe["host_paths_visible"] = {p: os.path.exists(p) for p in job.get("probe_paths", [])}
    probe["uid"] = os.getuid()
    probe["pid"] = os.getpid()
    isolation["probe"] = probe


def _wait(pid: int, timeout_s: float) -> tuple[int, object, bool]:
    """Wait for ``pid`` at most ``timeout_s`` seconds; kill it on overrun. Returns (status, rusage, timed_out)."""
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        pidfd = -1
    if pidfd >= 0:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or poller.poll(max(1, int(left * 1000) + 1)):
                break
        os.close(pidfd)
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage, False
    else:
        delay = 0.0002
        while time.monotonic() < deadline:
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                return status, usage, False
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
    timed_out = True
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    _, status, usage = os.wait4(pid, 0)
    return status, usage, timed_out


def _sweep(ns_init: bool, pgid: int) -> None:
    """Kill what a test left behind: as pid 1, every process of the namespace; else the test's group."""
    if ns_init:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        while True:
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == 0:
                break
    else:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def _clear_dir(path: str) -> None:
    """Empty the working directory between tests (each test starts from a fresh, empty directory)."""
    try:
        names = os.listdir(path)
    except OSError:
        return
    if names:
        import shutil

        for name in names:
            full = os.path.join(path, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                try:
                    os.unlink(full)
                except OSError:
                    pass


def _serve(job: dict, code_obj, prelude, rec_fd: int, isolation: dict, install_guard, run_test) -> None:
    """N1: run every test in a fresh child, one record per test."""
    ns_init = os.getpid() == 1
    limits = job["limits"]
    read_roots = tuple(job["read_roots"]) + tuple(_DEVICES) + (job["workdir"],)
    max_out = int(limits["max_file_bytes"])
    wall_s = float(limits["wall_s"])
    # Everything allocated so far is shared with each forked test: keep the collector from touching (and so
    # copying) those pages in every child.
    gc.collect()
    gc.freeze()
    for i, test in enumerate(job["tests"]):
        stdin_data = test.encode() if job["mode"] == "stdin" else b""
        fds = (_memfd("stdin", stdin_data), _memfd("stdout"), _memfd("stderr"), _memfd("result"))
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(rec_fd)
            run_test(job, code_obj, prelude, test, fds, read_roots, install_guard)
            os._exit(72)  # unreachable
        status, usage, timed_out = _wait(pid, wall_s)
        wall = time.monotonic() - t0
        _sweep(ns_init, pid)
        _clear_dir(job["workdir"])
        stdout, truncated = _read_memfd(fds[1], max_out)
        stderr, _ = _read_memfd(fds[2], 1 << 20)
        result, _ = _read_memfd(fds[3], 1 << 26)
        for fd in fds:
            os.close(fd)
        code = os.waitstatus_to_exitcode(status)
        record = {
            "event": "test",
            "i": i,
            "timed_out": timed_out,
            "returncode": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "wall_s": round(wall, 6),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 6),
            "max_rss_bytes": int(usage.ru_maxrss) * 1024,
            "stdout": stdout.decode("utf-8", "replace"),
            "stdout_truncated": truncated,
            "stderr": stderr.decode("utf-8", "replace")[-_STDERR_TAIL:],
            "result": None,
        }
        if result:
            try:
                record["result"] = json.loads(result)
            except ValueError:
                record["result"] = {"kind": "garbled"}
        _write_record(rec_fd, record)
    _write_record(rec_fd, {"event": "done"})


def main() -> int:
    job = json.loads(sys.stdin.buffer.read())
    rec_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    sys.path.insert(0, _HERE)
    import child  # noqa: PLC0415
    import guard  # noqa: PLC0415

    install_guard = guard.install
    run_test, Prelude = child.run_test, child.Prelude
    del sys.modules["guard"]
    del sys.modules["child"]
    sys.path.remove(_HERE)
    # Warm the modules of the prelude (imports in T then only look up sys.modules).
    sys.path.extend(p for p in job["sys_path"] if p not in sys.path)
    try:
        exec(compile(job["warm_imports"], "<warm>", "exec", dont_inherit=True), {})
    except Exception as exc:  # a missing optional module must not stop grading
        print(f"harness: warm-up import failed: {exc}", file=sys.stderr)
    import atexit  # noqa: F401  (needed in T)
    import threading  # noqa: F401
    import traceback  # noqa: F401

    sys.argv[:] = ["main.py"]
    sys.path[:] = [p for p in sys.path if p and p != _HERE]
    try:
        prelude = Prelude(job["prelude"])
    except Exception as exc:  # the prelude is ours; a failure here is a setup error, not the program's
        _write_record(rec_fd, {"event": "error", "error": f"prelude: {type(exc).__name__}: {exc}"})
        return 0
    try:
        code_obj = compile(job["code"], "main.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        _write_record(rec_fd, {"event": "compile_error", "error": f"{type(exc).__name__}: {exc}"})
        return 0
    isolation = {
        "pid_ns": False,
        "net_ns": False,
        "mount_ns": False,
        "user_ns": False,
        "fs_root": False,
        "user": "unchanged",
        "guard": bool(job["audit_hook"]),
        "rlimits": True,
        "errors": [],
    }
    want = job["isolation"]
    sys.path.insert(0, _HERE)
    import namespaces  # noqa: PLC0415

    sys.path.remove(_HERE)
    isolation["host_root"] = os.geteuid() == 0
    job["user_tasks"] = 0 if isolation["host_root"] else _count_user_tasks(os.getuid())
    if want != "none":
        try:
            if job.get("refuse_namespaces"):  # AREAL_SANDBOX_REFUSE_NAMESPACES: act as a container that refuses
                raise OSError(1, "unshare: Operation not permitted (simulated by AREAL_SANDBOX_REFUSE_NAMESPACES)")
            flags = namespaces.enter_namespaces(as_root=isolation["host_root"])
            isolation.update(
                pid_ns=bool(flags & namespaces.CLONE_NEWPID),
                net_ns=bool(flags & namespaces.CLONE_NEWNET),
                mount_ns=bool(flags & namespaces.CLONE_NEWNS),
                user_ns=bool(flags & namespaces.CLONE_NEWUSER),
            )
        except OSError as exc:
            isolation["errors"].append(f"namespaces: {exc}")
            if want == "strict":
                _write_record(rec_fd, {"event": "error", "error": f"isolation 'strict' needs namespaces: {exc}"})
                return 0
    try:
        namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    pid = os.fork()
    if pid == 0:  # N1
        try:
            namespaces.prctl(namespaces.PR_SET_PDEATHSIG, signal.SIGKILL)
            _setup_isolation(job, isolation)
            # Again: a change of credentials (the uid drop) clears the parent-death signal.
            job["_set_pdeathsig"](signal.SIGKILL)
            if want == "strict" and not _os_layers_complete(isolation):  # (the audit hook is off only in tests)
                raise Refused(f"isolation 'strict' needs every layer, got a reduced set: {isolation['errors']}")
            os.environ.clear()
            os.environ.update(job["env"])
            os.environ["HOME"] = os.environ["TMPDIR"] = job["workdir"]
            if job.get("probe"):
                _probe(job, isolation)
            _write_record(rec_fd, {"event": "ready", "isolation": isolation})
        except BaseException as exc:
            text = str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"
            _write_record(rec_fd, {"event": "error", "error": text})
            os._exit(3)
        try:
            _serve(job, code_obj, prelude, rec_fd, isolation, install_guard, run_test)
        except BaseException as exc:
            _write_record(rec_fd, {"event": "error", "error": f"{type(exc).__name__}: {exc}"})
            os._exit(4)
        os._exit(0)
    os.close(rec_fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
