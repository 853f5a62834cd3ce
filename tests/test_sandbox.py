"""The sandbox runs untrusted programs with limits and isolation, and hostile programs do no harm.

The hostile suite (tests/hostile/*.py, see its README) runs in every configuration:
all layers (``auto``); the reduced mode of a container that refuses namespaces (simulated with
``AREAL_SANDBOX_REFUSE_NAMESPACES=1``: an unprivileged uid, a task cap, rlimits, process group, audit hook);
and the operating-system layers alone (audit hook off).

Namespaces are required: a machine without them fails these tests unless the run declares their absence
with ``AREAL_SANDBOX_NAMESPACES_ABSENT=1`` (then the reduced-mode suite is what covers the sandbox, and the
tests check that the machine really gives the reduced level), so the layer that matters most cannot go
untested without anyone noticing.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from areal_cli.foundations.ports import free_port
from areal_cli.reward.code_grader import judge_run
from areal_cli.sandbox import Limits, SandboxRun, network_isolation, run_python, run_tests
from areal_cli.sandbox.limits import MiB
from helpers.one_line import assert_one_line

HOSTILE_DIR = Path(__file__).resolve().parent / "hostile"
HOSTILE = sorted(HOSTILE_DIR.glob("[0-9][0-9]_*.py"))
FAST = Limits(wall_s=1.0, memory_bytes=512 * MiB, max_file_bytes=8 * MiB)


NAMESPACES_ABSENT = os.environ.get("AREAL_SANDBOX_NAMESPACES_ABSENT", "") == "1"


@pytest.fixture(scope="module")
def isolation_info() -> dict:
    """What ``auto`` gives here; fails when that is not the full set and nobody declared it."""
    info = network_isolation()
    if NAMESPACES_ABSENT:
        assert info["level"] == "reduced", "AREAL_SANDBOX_NAMESPACES_ABSENT=1 but this machine gives the full set"
    elif info["level"] != "full":
        pytest.fail(
            f"the sandbox's full isolation is not available here ({info['summary']}); if this machine is known to "
            "refuse namespaces, declare it with AREAL_SANDBOX_NAMESPACES_ABSENT=1 (the reduced-mode suite then "
            "covers the sandbox)"
        )
    return info


# ------------------------------------------------------------------------------------ basic behaviour
@pytest.mark.multiproc
def test_program_reads_stdin_and_its_stdout_is_returned():
    r = run_python("a, b = map(int, input().split())\nprint(a + b)", stdin="2 40\n", limits=FAST)
    assert (r.returncode, r.stdout, r.outcome, r.timed_out) == (0, "42\n", "completed", False)


@pytest.mark.multiproc
def test_exit_status_stderr_and_exception_are_reported():
    r = run_python("import sys\nprint('partial')\nraise ValueError('bad input')", limits=FAST)
    assert r.returncode == 1 and r.outcome == "raised"
    assert r.stdout == "partial\n"
    assert "ValueError: bad input" in r.error and "ValueError: bad input" in r.stderr
    r = run_python("import sys\nsys.exit(3)", limits=FAST)
    assert (r.returncode, r.outcome, r.exit_code) == (0, "system_exit", 3)  # the process ends normally; the status is kept


@pytest.mark.multiproc
def test_busy_loop_is_killed_at_the_wall_clock_limit():
    limits = Limits(wall_s=0.5)
    t0 = time.monotonic()
    r = run_python("while True:\n    pass", limits=limits)
    assert r.timed_out and r.killed_by == "SIGKILL" and r.returncode is None
    assert 0.5 <= r.wall_s < 3.0 and time.monotonic() - t0 < 10.0


@pytest.mark.multiproc
def test_sleeping_program_is_killed_although_it_uses_no_cpu():
    r = run_python("import time\ntime.sleep(100)", limits=Limits(wall_s=0.5))
    assert r.timed_out and r.cpu_s < 0.5


@pytest.mark.multiproc
def test_allocation_beyond_the_memory_limit_fails_with_memory_error():
    r = run_python("x = bytearray(300 * 1024 * 1024)\nprint(len(x))", limits=Limits(wall_s=5, memory_bytes=256 * MiB))
    assert r.outcome == "raised" and r.error.startswith("MemoryError")
    r = run_python("x = bytearray(50 * 1024 * 1024)\nprint(len(x))", limits=Limits(wall_s=5, memory_bytes=256 * MiB))
    assert r.stdout == f"{50 * 1024 * 1024}\n"


@pytest.mark.multiproc
def test_output_beyond_the_file_size_limit_fails():
    r = run_python("import sys\nsys.stdout.write('x' * (2 << 20))", limits=Limits(wall_s=5, max_file_bytes=1 << 20))
    assert r.outcome == "raised" and "File too large" in r.error


@pytest.mark.multiproc
def test_each_test_starts_in_a_fresh_process_and_an_empty_directory():
    src = "import os\nprint(sorted(os.listdir('.')), os.getpid() > 0)\nopen('left_over.txt', 'w').write('x')"
    run = run_tests(src, ["", "", ""], limits=FAST, prelude="")
    assert [r.stdout for r in run.results] == ["[] True\n"] * 3


@pytest.mark.multiproc
def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("AREAL_TEST_TOKEN", "do-not-leak")
    r = run_python("import os\nprint(sorted(os.environ))", limits=FAST)
    names = eval(r.stdout)  # noqa: S307 - our own program's repr of a list of str
    assert "AREAL_TEST_TOKEN" not in names and "PYTHONPATH" not in names
    assert {"PATH", "HOME", "TMPDIR", "LANG"} <= set(names)


@pytest.mark.multiproc
def test_program_cannot_import_the_grader_or_see_the_repository():
    r = run_python("import areal_cli", limits=FAST)
    assert r.outcome == "raised" and "ModuleNotFoundError" in r.error


@pytest.mark.multiproc
def test_call_based_program_returns_a_json_value():
    src = "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        return (0, 1)\n"
    from areal_cli.sandbox import LCB_PRELUDE

    run = run_tests(src, [[[2, 7], 9]], fn_name="twoSum", limits=FAST, prelude=LCB_PRELUDE)
    assert run.results[0].outcome == "returned" and json.loads(run.results[0].value_json) == [0, 1]


@pytest.mark.multiproc
def test_stop_callback_ends_the_run_early():
    seen = []
    run = run_tests("print(input())", ["a", "b", "c"], limits=FAST, on_result=lambda i, r: seen.append(i) or i < 1)
    assert seen == [0, 1] and run.stopped_early and len(run.results) == 2


@pytest.mark.multiproc
def test_total_time_cap_stops_the_run():
    run = run_tests("import time\ntime.sleep(0.6)\nprint(1)", [""] * 10, limits=Limits(wall_s=2.0), total_timeout_s=1.5)
    assert run.total_timed_out and len(run.results) < 10


@pytest.mark.multiproc
def test_syntax_error_is_a_compile_error_with_no_run():
    run = run_tests("def f(:\n  pass", ["x"], limits=FAST)
    assert run.compile_error is not None and "SyntaxError" in run.compile_error and run.results == []


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="isolation"):
        run_tests("print(1)", [""], isolation="chroot")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stdin-mode tests must be strings"):
        run_tests("print(1)", [[1]])
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="max_open_files"):
        Limits(max_open_files=3)


@pytest.mark.multiproc
def test_isolation_report_is_consistent_with_what_the_program_sees(isolation_info):
    info = isolation_info
    assert info["guard"] and info["rlimits"] and info["nproc_limit"] is not None
    probe = info["probe"]
    if NAMESPACES_ABSENT:
        assert info["network"] == "audit hook only" and info["summary"].startswith("reduced: ")
        return
    assert info["level"] == "full" and info["summary"].startswith("full: pid, net and mount namespaces")
    assert probe["interfaces"] == ["lo"] and probe["route_to_internet"] is False
    assert info["network"] == "network namespace"
    assert probe["pid"] == 1
    import tempfile

    from areal_cli.sandbox import read_roots

    # Host paths are invisible unless a read root lies under them (``/root`` holds a pyenv Python, for one).
    for path, visible in probe["host_paths_visible"].items():
        assert visible == any(r.startswith(path.rstrip("/") + "/") for r in read_roots()), (path, visible)
    # the temp dir is among them: invisible unless the checkout (its .venv, a read root) lives under it
    assert tempfile.gettempdir() in probe["host_paths_visible"]
    if info["host_root"]:
        assert probe["uid"] == int(info["user"].split()[1]) and probe["uid"] != 0


@pytest.mark.multiproc
def test_the_reduced_mode_says_so_and_still_drops_root_and_caps_tasks(reduced_mode):
    """A container that refuses namespaces: the level says "reduced" (and why), the program does not run as
    root, and its tasks (processes and threads) are capped: a thread bomb stops at the cap."""
    info = network_isolation()
    assert info["level"] == "reduced" and info["network"] == "audit hook only"
    assert "no namespaces (namespaces: [Errno 1]" in info["summary"] and "simulated" in info["summary"]
    assert info["probe"]["uid"] != 0 and info["nproc_limit"] is not None
    bomb = ("import threading, time\nn = 0\ntry:\n    while n < 500:\n"
            "        threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); n += 1\n"
            "except RuntimeError as e:\n    print('stopped at', n, e)\n")
    limits = Limits(wall_s=10, max_procs=8)
    run = run_tests(bomb, [""], limits=limits, prelude="")
    out = run.results[0].stdout
    assert out.startswith("stopped at ") and "can't start new thread" in out, (out, run.results[0].stderr)
    if os.geteuid() == 0:  # a uid of its own: exactly the cap, the harness worker and the main thread included
        assert int(out.split()[2]) <= limits.max_procs - 2, out


@pytest.mark.multiproc
def test_as_root_without_a_reachable_interpreter_the_sandbox_refuses_rather_than_run_as_root(monkeypatch):
    """Root, no namespaces, and an interpreter no unprivileged uid can reach: one line saying why and what to
    do, and nothing runs (never a program as the host's root)."""
    from areal_cli.sandbox import SandboxError, host

    monkeypatch.setenv("AREAL_SANDBOX_REFUSE_NAMESPACES", "1")
    monkeypatch.setattr(host, "unreachable", lambda paths: "/opt/private is mode 700, on the way to /opt/private/py")
    if os.geteuid() != 0:  # nothing to drop: the program runs as this (unprivileged) user
        run = run_tests("import os\nprint(os.getuid())", [""], limits=FAST)
        assert run.isolation["level"] == "reduced" and run.results[0].stdout == f"{os.getuid()}\n"
        return
    with pytest.raises(SandboxError) as err:
        run_tests("open('/tmp/areal-ran-as-root', 'w')", [""], limits=FAST)
    message = str(err.value)
    assert_one_line(message, "/opt/private is mode 700", "AREAL_SANDBOX_PYTHON")
    assert not os.path.exists("/tmp/areal-ran-as-root")


@pytest.mark.multiproc
def test_strict_isolation_refuses_the_reduced_mode_and_runs_with_the_full_set(monkeypatch, isolation_info):
    from areal_cli.sandbox import SandboxError

    monkeypatch.setenv("AREAL_SANDBOX_REFUSE_NAMESPACES", "1")
    with pytest.raises(SandboxError, match="isolation 'strict' needs namespaces"):
        run_tests("print(1)", [""], limits=FAST, isolation="strict")
    monkeypatch.setenv("AREAL_SANDBOX_ISOLATION", "strict")  # the environment's default for "auto"
    with pytest.raises(SandboxError, match="isolation 'strict'"):
        run_tests("print(1)", [""], limits=FAST)
    monkeypatch.delenv("AREAL_SANDBOX_REFUSE_NAMESPACES")
    if not NAMESPACES_ABSENT:
        run = run_tests("print(1)", [""], limits=FAST)
        assert run.isolation["level"] == "full" and run.results[0].stdout == "1\n"


@pytest.mark.parametrize(
    "name, value, match",
    [
        ("AREAL_SANDBOX_ISOLATION", "paranoid", "expected 'auto' or 'strict'"),
        ("AREAL_SANDBOX_UID_RANGE", "5-2", "LO <= HI"),
        ("AREAL_SANDBOX_UID_RANGE", "lots", "expected LO-HI"),
        ("AREAL_SANDBOX_PYTHON", "python3", "not an absolute path"),
        ("AREAL_SANDBOX_PYTHON", "/bin/true", "cannot run it as Python"),
    ],
)
def test_malformed_sandbox_settings_are_one_line_errors(monkeypatch, name, value, match):
    from areal_cli.sandbox import SandboxError

    monkeypatch.setenv(name, value)
    with pytest.raises(SandboxError, match=match) as err:
        run_tests("print(1)", [""], limits=FAST)
    assert_one_line(str(err.value), name)


@pytest.mark.multiproc
def test_the_uid_comes_from_the_configured_range(monkeypatch, reduced_mode):
    monkeypatch.setenv("AREAL_SANDBOX_UID_RANGE", "424242-424243")
    run = run_tests("import os\nprint(os.getuid())", [""], limits=FAST, prelude="")
    if os.geteuid() == 0:
        assert run.results[0].stdout.strip() in ("424242", "424243") and run.sandbox_uid in (424242, 424243)


@pytest.mark.multiproc
@pytest.mark.parametrize("audit_hook", [True, False])
def test_a_file_in_the_host_temp_dir_cannot_be_read_inside(isolation_info, audit_hook):
    """The exposure, not a path: a marker with random content in the real temp dir must not be readable by the
    program, wherever the checkout (and its virtualenv, which the sandbox mounts) lives. With the audit hook off
    only the file-system root stands in the way: without one (no mount namespace here) the report must say so
    and the file is then readable, which the test checks too, so that the report cannot claim a wall it lacks."""
    import tempfile

    walled = audit_hook or bool(isolation_info["fs_root"])
    secret = secrets.token_hex(16)
    marker = Path(tempfile.gettempdir()) / f"areal-marker-{secrets.token_hex(6)}"
    marker.write_text(secret)
    try:
        os.chmod(marker, 0o644)
        run = run_tests(f"try:\n    print(open({str(marker)!r}).read())\nexcept BaseException as e:\n"
                        f"    print('blocked', type(e).__name__)\n", [""], limits=FAST, prelude="",
                        audit_hook=audit_hook)
        out = run.results[0].stdout
        assert bool(run.isolation["fs_root"]) == bool(isolation_info["fs_root"])
        if walled:
            assert secret not in out and "blocked" in out, out
        else:
            assert secret in out, out
    finally:
        marker.unlink()


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["auto", "reduced"])
def test_killing_the_grader_takes_the_sandbox_down_with_it(mode, open_tmp, request):
    """The harness and the program die with the grader (parent-death signals, pid namespace)."""
    import subprocess

    env = dict(os.environ, **(request.getfixturevalue("reduced_mode") if mode == "reduced" else {}))
    code = (
        f"import tempfile; tempfile.tempdir = {str(open_tmp)!r}  # a killed grader cannot remove its temp dir\n"
        "from areal_cli.sandbox import run_tests, Limits\n"
        "run_tests('import time\\ntime.sleep(100)', [''], limits=Limits(wall_s=60))\n"
    )
    grader = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 20
        harness = []
        while not harness and time.monotonic() < deadline:
            time.sleep(0.1)
            harness = [pid for pid in _children(grader.pid) if b"harness.py" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert harness, "the harness did not start"
        time.sleep(0.5)  # let it fork the test process
        sid = harness[0]  # the harness leads its own session
        assert _processes(lambda s, uid, state: s == sid), "no process in the harness's session"
    finally:
        grader.kill()
        grader.wait()
    deadline = time.monotonic() + 5
    while _processes(lambda s, uid, state: s == sid and state != b"Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes(lambda s, uid, state: s == sid and state != b"Z")


def _children(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                raw = Path(f"/proc/{name}/stat").read_bytes()
                if int(raw[raw.rindex(b")") + 2 :].split()[1]) == pid:
                    out.append(int(name))
            except (OSError, ValueError):
                continue
    return out


@pytest.mark.multiproc
def test_the_reduced_mode_still_runs_programs(reduced_mode):
    run = run_tests("print(int(input()) * 2)", ["21"], limits=FAST)
    assert run.results[0].stdout == "42\n"
    assert run.isolation["pid_ns"] is False and run.isolation["guard"] is True and run.isolation["level"] == "reduced"


@pytest.mark.multiproc
def test_audit_hook_allows_ordinary_programs():
    """Common competitive-programming idioms keep working under the guard (no false refusals)."""
    src = (
        "import sys, os, io, threading, resource, tempfile, numpy\n"
        "resource.setrlimit(resource.RLIMIT_STACK, resource.getrlimit(resource.RLIMIT_STACK))\n"
        "threading.stack_size(1 << 26)\n"
        "data = sys.stdin.buffer.read().split()\n"
        "with open('scratch.txt', 'w') as fh: fh.write('ok')\n"
        "with tempfile.TemporaryFile() as t: t.write(b'x')\n"
        "out = []\n"
        "def main():\n"
        "    out.append(str(sum(map(int, data)) + int(numpy.int64(0))))\n"
        "t = threading.Thread(target=main); t.start(); t.join()\n"
        "os.write(1, (open('scratch.txt').read() + ' ' + out[0] + '\\n').encode())\n"
    )
    r = run_python(src, stdin="1 2 3\n", limits=Limits(wall_s=20))
    assert r.stdout == "ok 6\n", r.stderr


@pytest.mark.multiproc
def test_audit_hook_allows_ordinary_programs_in_the_reduced_mode(reduced_mode):
    test_audit_hook_allows_ordinary_programs()


# ---------------------------------------------------------------------------------- hostile programs
@dataclass
class Canary:
    dir: Path
    victim: Path
    secret: Path
    secret_text: str
    token: str
    port: int
    env_marker: str
    before: dict
    sink: "Sink | None" = None

    def snapshot(self) -> dict:
        return {
            p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in sorted(self.dir.iterdir())
        }


class Sink:
    """A TCP listener and a UDP socket on 127.0.0.1 owned by the grader, recording every byte that reaches them:
    a connection or datagram from a sandboxed program that got through is seen here, whatever the machine's
    network (an offline CI machine fails outside connections by itself, so those prove nothing)."""

    def __init__(self):
        import threading

        self.received: list[tuple[str, bytes]] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.tcp.settimeout(0.2)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.udp.settimeout(0.2)
        self.tcp_port, self.udp_port = self.tcp.getsockname()[1], self.udp.getsockname()[1]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._accept, self._datagrams)]
        for t in self._threads:
            t.start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                data = b""
                try:
                    while chunk := conn.recv(4096):
                        data += chunk
                except OSError:
                    pass
                self.received.append(("tcp", data or b"(connected, no bytes)"))

    def _datagrams(self):
        while not self._stop.is_set():
            try:
                data, _ = self.udp.recvfrom(4096)
            except OSError:
                continue
            self.received.append(("udp", data))

    def close(self) -> list[tuple[str, bytes]]:
        """Stop (after a moment for in-flight bytes) and return what was received."""
        time.sleep(0.15)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2)
        self.tcp.close()
        self.udp.close()
        return self.received


def make_canary(base: Path, env_marker: str) -> Canary:
    """A world-readable, world-writable directory with a victim file and a secret file (random name)."""
    d = base / "canary"
    d.mkdir(parents=True)
    os.chmod(base, 0o755)
    os.chmod(d, 0o777)  # only the sandbox stands between the program and these files
    victim = d / "victim.txt"
    victim.write_text("victim data\n")
    os.chmod(victim, 0o644)
    secret_text = "SECRET-" + secrets.token_hex(16)
    secret = d / f"secret_{secrets.token_hex(6)}.txt"
    secret.write_text(secret_text + "\n")
    os.chmod(secret, 0o644)
    c = Canary(d, victim, secret, secret_text, secrets.token_hex(6), free_port(), env_marker, {}, Sink())
    c.before = c.snapshot()
    return c


def _header(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(":")
        out[key.strip()] = value.strip()
    return out


def _processes(pred) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
            fields = raw[raw.rindex(b")") + 2 :].split()
            uid = os.stat(f"/proc/{name}").st_uid
        except (OSError, ValueError):
            continue
        if pred(int(fields[3]), uid, fields[0]):
            found.append(int(name))
    return found


def _leftover_processes(run: SandboxRun) -> list[int]:
    """Processes still in the harness's session or owned by the sandbox's uid (zombies ignored), after
    giving the kernel up to 3 s to finish tearing the namespace down."""
    deadline = time.monotonic() + 3.0
    while True:
        left = _processes(
            lambda sid, uid, state: state != b"Z"
            and (sid == run.harness_pid or (run.sandbox_uid is not None and uid == run.sandbox_uid))
        )
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _grader_initial_environment() -> list[str]:
    """Distinctive ``KEY=VALUE`` entries of this process's initial environment (what /proc/PID/environ
    shows), excluding entries the sandbox sets itself."""
    own = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "TZ=UTC"}
    with open(f"/proc/{os.getpid()}/environ", "rb") as fh:
        entries = fh.read().decode("utf-8", "replace").split("\0")
    return [
        e for e in entries
        if len(e) >= 12 and e not in own and e.isprintable() and not any(ch in e for ch in "\\'\"")
    ]


def _run_hostile(path: Path, c: Canary, isolation: str, audit_hook: bool) -> list[str]:
    """Run one hostile program; return the list of harms/problems found (empty = contained)."""
    header = _header(path)
    src = (
        path.read_text()
        .replace("{CANARY}", str(c.dir))
        .replace("{TOKEN}", c.token)
        .replace("{PORT}", str(c.port))
        .replace("{PID}", str(os.getpid()))
        .replace("{SINK_TCP}", str(c.sink.tcp_port))
        .replace("{SINK_UDP}", str(c.sink.udp_port))
    )
    call = header.get("mode") == "call"
    tests = [[1, 2]] if call else ["1 2\n"]
    run = run_tests(
        src, tests, fn_name="solve" if call else None, limits=FAST, total_timeout_s=20,
        isolation=isolation, audit_hook=audit_hook,  # type: ignore[arg-type]
    )
    problems = []
    if run.compile_error is None:
        if len(run.results) != 1:
            problems.append(f"expected one result, got {len(run.results)}")
        else:
            verdict, _ = judge_run(run.results[0], "3", call_based=call)
            if verdict == "passed":
                problems.append("graded as passed")
    text = "\n".join(r.stdout + r.stderr + r.error for r in run.results)
    for needle, what in ((c.secret_text, "secret content"), (c.secret.name, "secret file name"), (c.env_marker, "grader env")):
        if needle in text:
            problems.append(f"leaked {what}")
    leaked_env = [entry for entry in _grader_initial_environment() if entry in text]
    if leaked_env:
        problems.append(f"leaked the grader's environment: {leaked_env[:3]}")
    if c.snapshot() != c.before:
        problems.append(f"canary changed: {sorted(c.snapshot())} vs {sorted(c.before)}")
    for place in ("/tmp", "/dev/shm", "/var/tmp"):
        if os.path.exists(f"{place}/areal_pwned_{c.token}"):
            os.unlink(f"{place}/areal_pwned_{c.token}")
            problems.append(f"created {place}/areal_pwned_{c.token}")
    with socket.socket() as s:
        s.settimeout(0.5)
        if s.connect_ex(("127.0.0.1", c.port)) == 0:
            problems.append(f"port {c.port} is listening")
    left = _leftover_processes(run)
    if left:
        problems.append(f"processes left: {left}")
    got = c.sink.close()
    if got:
        problems.append(f"reached the grader's own sockets over the network: {got[:3]}")
    return problems


def _run_suite(canary_factory, isolation: str, audit_hook: bool, only_os_layer: bool = False) -> None:
    programs = [p for p in HOSTILE if not only_os_layer or _header(p).get("layers") == "os"]
    assert len(programs) >= (15 if only_os_layer else 30)

    def one(path: Path) -> tuple[str, list[str]]:
        return path.name, _run_hostile(path, canary_factory(), isolation, audit_hook)

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(one, programs))
    harmed = {name: problems for name, problems in outcomes if problems}
    assert not harmed, json.dumps(harmed, indent=1)
    # The grader (this process) is alive and still grades: a correct program passes.
    run = run_tests("a, b = map(int, input().split())\nprint(a + b)", ["1 2\n"], limits=FAST, isolation=isolation)  # type: ignore[arg-type]
    assert judge_run(run.results[0], "3", call_based=False)[0] == "passed"


@pytest.fixture
def open_tmp():
    """A temp directory every uid can reach (pytest's own ``tmp_path`` lies under a mode-700 directory, which
    alone would stop a sandbox that runs as another uid, proving nothing about the sandbox)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="areal-test-"))
    os.chmod(path, 0o755)
    assert all(os.stat(d).st_mode & 0o001 for d in path.parents), f"{tempfile.gettempdir()} is not reachable by others"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def canary_factory(open_tmp, monkeypatch):
    """A fresh canary directory per hostile program (programs run two at a time), reachable by any uid; the
    grader's own environment holds a marker that must never reach a program's output."""
    marker = "ENVMARK-" + secrets.token_hex(12)
    monkeypatch.setenv("AREAL_GRADER_SECRET", marker)
    counter = iter(range(10**6))
    return lambda: make_canary(open_tmp / f"c{next(counter)}", marker)


@pytest.mark.multiproc
@pytest.mark.parametrize("program", ["23_socket_connect.py", "25_dns_and_udp.py"])
def test_the_network_checks_catch_bytes_that_get_through(program, canary_factory, reduced_mode):
    """With every layer off (no namespaces, no audit hook) the program's bytes reach the grader's own sockets, and
    the check reports it: the network checks can fail, so their passing in the suites means something."""
    problems = _run_hostile(HOSTILE_DIR / program, canary_factory(), "none", audit_hook=False)
    assert any("reached the grader's own sockets" in p and "LEAK-" in p for p in problems), problems


def test_hostile_suite_has_at_least_30_documented_programs():
    assert len(HOSTILE) >= 30
    for path in HOSTILE:
        header = _header(path)
        assert header.get("harm") and header.get("check"), f"{path.name}: header needs '# harm:' and '# check:'"


@pytest.mark.multiproc
@pytest.mark.slow
def test_hostile_programs_do_no_harm_with_all_layers(canary_factory):
    _run_suite(canary_factory, "auto", audit_hook=True)


@pytest.mark.multiproc
@pytest.mark.slow
def test_hostile_programs_do_no_harm_in_the_reduced_mode_of_a_container_that_refuses_namespaces(canary_factory, reduced_mode):
    """No process outlives its test, nothing is written outside its directory, no planted secret is read, no
    byte reaches the grader's sockets: with namespaces refused (as unprivileged Docker and Kubernetes do)."""
    assert network_isolation()["level"] == "reduced"
    _run_suite(canary_factory, "auto", audit_hook=True)


@pytest.mark.multiproc
@pytest.mark.slow
def test_operating_system_layers_alone_contain_hostile_programs(canary_factory, isolation_info):
    if NAMESPACES_ABSENT:  # declared: the reduced-mode suite covers the sandbox; strict grading must refuse here
        from areal_cli.sandbox import SandboxError

        with pytest.raises(SandboxError, match="strict"):
            run_tests("print(1)", [""], limits=FAST, isolation="strict")
        return
    _run_suite(canary_factory, "strict", audit_hook=False, only_os_layer=True)


@pytest.mark.multiproc
def test_a_uid_range_over_real_accounts_is_refused(monkeypatch, reduced_mode):
    """A program must never run as a real user (``nobody`` included): such a range is one line, nothing runs."""
    import pwd

    from areal_cli.sandbox import SandboxError

    uid = pwd.getpwnam("nobody").pw_uid if "nobody" in {p.pw_name for p in pwd.getpwall()} else os.getuid()
    monkeypatch.setenv("AREAL_SANDBOX_UID_RANGE", f"{uid}-{uid}")
    with pytest.raises(SandboxError, match="belong to accounts of this machine") as err:
        run_tests("print(1)", [""], limits=FAST)
    assert_one_line(str(err.value))
