"""In-process guard for untrusted Python: an audit hook (PEP 578) that refuses harmful operations.

Defence in depth, not the boundary. The boundary is the operating system: rlimits, a separate process
group, and, where the machine allows, fresh namespaces (pid, net, mount, ipc, uts), a minimal read-only
root and an unprivileged user (see :mod:`areal_cli.sandbox.namespaces`). Where namespaces are not
available this hook is what stops a program from reading or writing files outside its directory, opening
sockets, signalling other processes or starting new ones, so it has to be strict on its own.

This file is stdlib-only and is imported by the in-child harness (``harness.py``, run as a plain script
by an isolated interpreter), never by the grader process itself.

Policy (every refused event raises ``PermissionError``, so a program sees an ordinary ``OSError``):

- ``open`` / ``os.open`` of a path: writing (any of ``O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND``) only
  inside the working directory; reading inside the working directory or a read root (the Python
  installation, system libraries, ``/dev/null`` ...). Integer file descriptors are allowed (the program
  only holds its own stdin/stdout/stderr and the harness's result file).
- file-system mutations (``os.remove``, ``os.rename``, ``os.rmdir``, ``os.mkdir``, ``os.chmod``,
  ``os.chown``, ``os.link``, ``os.symlink``, ``os.truncate``, ``os.utime``, xattrs, ``shutil.rmtree``,
  ``os.chdir``): every path inside the working directory; a ``dir_fd`` argument is refused.
- ``os.listdir`` / ``os.scandir``: inside the working directory or a read root.
- processes: ``os.fork``, ``os.forkpty``, ``os.exec``, ``os.posix_spawn``, ``os.spawn``, ``os.system``,
  ``subprocess.Popen``, ``pty.spawn``: refused. ``os.kill``/``os.killpg``/``signal.pthread_kill``: only
  the program's own pid.
- network: ``socket.__new__``, name resolution (``socket.getaddrinfo`` ...) and ``socket.*`` events: refused.
- native code: loading a library, looking up a symbol, calling a foreign function or touching raw memory
  through ctypes (``ctypes.*`` events; ``import ctypes`` itself is allowed because numpy needs it);
  importing the real ``_posixsubprocess`` (a stub stands in), ``_xxsubinterpreters`` or the C test
  modules; loading an extension module from outside the read roots (e.g. one written into the working
  directory): refused.
- tampering with this hook: ``gc.get_objects``/``get_referrers``/``get_referents``,
  ``sys._current_frames``, ``code.__new__`` (hand-made bytecode), and setting a function's ``__code__``:
  refused. The hook keeps no reference in any module, so it is reachable only through those.

Known limits (why this is not the boundary): checks are on paths before the kernel resolves them
(a symlink swapped in between is a race), and CPython's own documentation says audit hooks are not a
sandbox. Frames reached through a traceback (``tb_frame``, allowed so tracebacks print) expose only the
harness's own state in the same disposable process, which holds no expected outputs.
"""

from __future__ import annotations

import os
import sys
import types

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# ``_posixsubprocess.fork_exec`` starts processes without an audit event of its own; the harness puts a
# stub in ``sys.modules`` (so ``import subprocess`` still works) and re-importing the real one is refused.
_BLOCKED_MODULES = frozenset({"_posixsubprocess", "_xxsubinterpreters", "_testcapi", "_testinternalcapi", "_ctypes_test"})

_BLOCKED_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.startfile",
        "subprocess.Popen",
        "pty.spawn",
        "socket.__new__",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.gethostname",
        "socket.sethostname",
        "socket.getnameinfo",
        "socket.getservbyname",
        "socket.getservbyport",
        "socket.bind",
        "socket.connect",
        "socket.sendto",
        "socket.sendmsg",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys._current_frames",
        "code.__new__",
        "os.setuid",
        "os.setgid",
        "os.setpgid",
        "sys.addaudithook",
        "winreg.OpenKey",
    }
)

# Events that change the file system: event -> (indices of paths that must lie inside the working
# directory, indices of paths that must be readable, indices of dir_fd arguments, which must be unset).
# Argument layouts are CPython's (``-1`` or ``None`` means "no dir_fd"); an int in a path position is a
# file descriptor the program already holds (``os.fchmod`` ...), which is allowed.
_MUTATING_PATH_EVENTS: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {
    "os.remove": ((0,), (), (1,)),
    "os.rmdir": ((0,), (), (1,)),
    "os.mkdir": ((0,), (), (2,)),
    "os.rename": ((0, 1), (), (2, 3)),
    "os.link": ((0, 1), (), (2, 3)),
    "os.symlink": ((1,), (), (2,)),  # args[0] is the link's text, not a path that gets opened
    "os.chmod": ((0,), (), (2,)),
    "os.chown": ((0,), (), (3,)),
    "os.truncate": ((0,), (), ()),
    "os.utime": ((0,), (), (3,)),
    "os.chflags": ((0,), (), ()),
    "os.lchflags": ((0,), (), ()),
    "os.setxattr": ((0,), (), ()),
    "os.removexattr": ((0,), (), ()),
    "os.chdir": ((0,), (), ()),
    "shutil.rmtree": ((0,), (), (1,)),
    "shutil.move": ((0, 1), (), ()),
    "shutil.copyfile": ((1,), (0,), ()),
    "shutil.copymode": ((1,), (0,), ()),
    "shutil.copystat": ((1,), (0,), ()),
    "shutil.copytree": ((1,), (0,), ()),
}

_LISTING_EVENTS = frozenset({"os.listdir", "os.scandir", "os.listxattr", "os.getxattr", "glob.glob", "glob.glob/2"})


def install(workdir: str, read_roots: tuple[str, ...]) -> None:
    """Install the audit hook for the rest of this process's life (it cannot be removed).

    Args:
        workdir: the program's working directory (read/write allowed inside).
        read_roots: directories/files the program may read besides ``workdir`` (absolute paths).
    """
    workdir_real = os.path.realpath(workdir)
    write_roots = (workdir_real,)
    library_roots = tuple(sorted({os.path.realpath(p) for p in read_roots} - {workdir_real}))
    readable = tuple(sorted(set(library_roots) | {workdir_real}))
    realpath = os.path.realpath
    fspath = os.fspath
    own_pid = os.getpid()
    blocked_modules = _BLOCKED_MODULES
    blocked_events = _BLOCKED_EVENTS
    # Private immutable copies: the module-level tables stay reachable through ``sys.modules`` and could be
    # edited by the program; these are reachable only through the hook itself.
    mutating = types.MappingProxyType(dict(_MUTATING_PATH_EVENTS))
    listing = _LISTING_EVENTS
    write_flags = _WRITE_FLAGS

    def _inside(path: object, roots: tuple[str, ...]) -> bool:
        try:
            p = fspath(path)
        except TypeError:
            return False
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        if not p or "\x00" in p:
            return False
        full = realpath(p)
        for root in roots:
            if full == root or full.startswith(root.rstrip("/") + "/"):
                return True
        return False

    def _refuse(event: str, detail: object) -> None:
        raise PermissionError(f"sandbox: {event} refused ({detail!r})")

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int):
                return
            if mode is not None:
                writing = any(c in mode for c in "wax+")
            else:
                writing = bool((flags or 0) & write_flags)
            if not _inside(path, write_roots if writing else readable):
                _refuse("open", path)
            return
        if event in blocked_events:
            _refuse(event, args[:1])
        if event == "import":
            name = args[0]
            top = name.split(".", 1)[0] if isinstance(name, str) else ""
            if name in blocked_modules or top in blocked_modules:
                _refuse("import", name)
            filename = args[1] if len(args) > 1 else None
            if filename is not None and not _inside(filename, library_roots):
                _refuse("import", filename)
            return
        rule = mutating.get(event)
        if rule is not None:
            must_write, must_read, dir_fds = rule
            for i in dir_fds:
                if i < len(args) and args[i] is not None and args[i] != -1:
                    _refuse(event, "dir_fd")
            for i in must_write:
                if i < len(args) and not isinstance(args[i], int) and not _inside(args[i], write_roots):
                    _refuse(event, args[i])
            for i in must_read:
                if i < len(args) and not isinstance(args[i], int) and not _inside(args[i], readable):
                    _refuse(event, args[i])
            return
        if event in listing:
            if args and isinstance(args[0], int):
                return
            if not _inside(args[0] if args and args[0] is not None else ".", readable):
                _refuse(event, args[0] if args else None)
            return
        if event == "resource.prlimit" and args and args[0] not in (0, own_pid):
            _refuse(event, args[:1])
        if event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            if event == "os.kill" and args[0] == own_pid:
                return
            _refuse(event, args[:2])
        if event.startswith("ctypes."):
            # ``import ctypes`` opens the main program (dlopen(None)), and numpy imports ctypes: allowed.
            # Loading any library (its constructors would run native code), looking up a symbol, calling a
            # foreign function, or reading/writing raw memory is refused.
            if event == "ctypes.dlopen" and args and args[0] is None:
                return
            _refuse(event, args[:1])
        if event.startswith("socket."):
            _refuse(event, args[:1])
        if event == "object.__setattr__" and len(args) > 1 and args[1] in ("__code__", "__globals__"):
            _refuse(event, args[1])

    sys.addaudithook(hook)
