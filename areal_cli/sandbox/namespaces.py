"""Linux namespaces, a minimal read-only root, and privilege dropping for the sandbox (stdlib + ctypes).

Used only inside the harness process (``harness.py``), before any untrusted code runs; never imported by
the grader process. Python 3.11 has no ``os.unshare``/``mount``/``pivot_root``/``prctl``, so this calls
libc through ctypes. After setup the harness deletes ``ctypes`` from ``sys.modules`` and drops its own
references (:func:`forget_libc`), so a program cannot reach libc through this module.

What :func:`enter_namespaces` + :func:`build_root` give a program (the OS boundary):

- pid namespace: the harness's worker is pid 1; it kills every other process in the namespace after each
  test, and when it exits the kernel kills whatever is left (no stray processes, even after ``setsid``).
- network namespace: only a loopback interface, which is down: no network at all.
- mount namespace + ``pivot_root`` into a fresh tmpfs holding read-only bind mounts of the Python
  installation and system libraries only (``/usr``, ``/lib*``, the interpreter's prefixes,
  ``/etc/ld.so.cache``), ``/dev/{null,zero,random,urandom}``, and a size-limited tmpfs working directory
  at ``/sandbox``. Nothing else of the host file system is visible (home directories, data sets, /tmp).
- ipc and uts namespaces: no shared memory or message queues with the host.
- user: as root, the worker switches to a random unprivileged uid/gid (no capabilities; ``RLIMIT_NPROC``
  then counts only this sandbox's processes); as a normal user, an unprivileged user namespace maps the
  caller's uid to root inside, and all capabilities are dropped after setup.

Every function raises ``OSError`` (with errno) when the kernel refuses; the harness then falls back and
reports which parts of the isolation it got.
"""

from __future__ import annotations

import errno
import os
import platform

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38

_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CAP_LAST_CAP_GUESS = 63

_libc = None


def _lib():
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def parent_death_signal_setter():
    """A function ``f(sig)`` doing ``prctl(PR_SET_PDEATHSIG, sig)`` that keeps working after
    :func:`forget_libc` (the harness's test children call it before the program runs; calling through it
    from the program would raise the ``ctypes.call_function`` audit event, which the guard refuses)."""
    import ctypes

    prctl_fn = _lib().prctl

    def set_pdeathsig(sig: int) -> None:
        prctl_fn(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0)

    return set_pdeathsig


def forget_libc() -> None:
    """Drop this module's libc handle (called once setup is done, before untrusted code runs)."""
    global _libc
    _libc = None


def _check(ret: int, what: str) -> int:
    if ret == -1:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def unshare(flags: int) -> None:
    """``unshare(2)``. Raises OSError (EPERM when not allowed, EINVAL when unsupported)."""
    _check(_lib().unshare(flags), "unshare")


def prctl(option: int, arg: int) -> None:
    """``prctl(option, arg, 0, 0, 0)``."""
    import ctypes

    _check(_lib().prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """``mount(2)``."""
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(_lib().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def umount2(target: str, flags: int) -> None:
    """``umount2(2)``."""
    _check(_lib().umount2(os.fsencode(target), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    """``pivot_root(2)`` via ``syscall`` (glibc has no wrapper). Raises OSError ENOSYS on unknown arches."""
    nr = _SYS_PIVOT_ROOT.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown syscall number on {platform.machine()}")
    _check(_lib().syscall(nr, os.fsencode(new_root), os.fsencode(put_old)), "pivot_root")


def write_id_maps(outer_uid: int, outer_gid: int) -> None:
    """Map root inside a fresh user namespace to the caller's uid/gid outside (one id each)."""
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"0 {outer_uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"0 {outer_gid} 1")


def enter_namespaces(as_root: bool) -> int:
    """Unshare pid, net, mount, ipc and uts namespaces (plus a user namespace when not root).

    The calling process keeps its pid; its next child becomes pid 1 of the new pid namespace.

    Returns:
        the flags that took effect.
    Raises:
        OSError: the kernel refused (no CAP_SYS_ADMIN, user namespaces disabled, seccomp ...).
    """
    flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
    if not as_root:
        uid, gid = os.getuid(), os.getgid()
        unshare(flags | CLONE_NEWUSER)
        write_id_maps(uid, gid)
        return flags | CLONE_NEWUSER
    unshare(flags)
    return flags


def _locked_flags(path: str) -> int:
    """Mount flags of the mount holding ``path`` that a bind remount must keep (or EPERM in a userns)."""
    st = os.statvfs(path).f_flag
    out = 0
    for st_flag, ms_flag in (
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    ):
        if st & st_flag:
            out |= ms_flag
    return out


def _bind_readonly(src: str, new_root: str) -> None:
    dst = new_root + src
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "a"):
            pass
    mount(src, dst, None, MS_BIND | MS_REC)
    mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | _locked_flags(src))


def build_root(
    staging: str,
    read_roots: list[str],
    devices: list[str],
    work_bytes: int,
    work_uid: int,
    work_gid: int,
) -> str:
    """Make a fresh root file system and ``pivot_root`` into it; the caller's cwd becomes ``/sandbox``.

    Args:
        staging: an existing empty directory on the host used as the new root's mount point.
        read_roots: absolute, symlink-free host paths bind-mounted read-only at the same path.
        devices: device nodes bind-mounted at the same path (``/dev/null`` ...).
        work_bytes: size of the tmpfs at ``/sandbox`` (the program's working directory).
        work_uid, work_gid: owner of ``/sandbox`` (the uid the program will run as).
    Returns:
        ``"/sandbox"``.
    Raises:
        OSError: a mount or pivot_root failed.
    """
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=755")
    for src in read_roots:
        _bind_readonly(src, staging)
    # Top-level symlinks such as /lib -> usr/lib, /lib64 -> usr/lib64 (merged-/usr systems).
    for name in os.listdir("/"):
        path = "/" + name
        if os.path.islink(path) and not os.path.lexists(staging + path):
            os.symlink(os.readlink(path), staging + path)
    for dev in devices:
        if os.path.exists(dev):
            _bind_readonly_device(dev, staging)
    os.makedirs(staging + "/sandbox", exist_ok=True)
    mount(
        "tmpfs",
        staging + "/sandbox",
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={max(work_bytes, 4096)},nr_inodes=1024,mode=700,uid={work_uid},gid={work_gid}",
    )
    os.makedirs(staging + "/.old_root", exist_ok=True)
    pivot_root(staging, staging + "/.old_root")
    os.chdir("/")
    umount2("/.old_root", MNT_DETACH)
    os.rmdir("/.old_root")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/sandbox")
    return "/sandbox"


def _bind_readonly_device(dev: str, new_root: str) -> None:
    dst = new_root + dev
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "a"):
        pass
    mount(dev, dst, None, MS_BIND)
    mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_NOSUID | _locked_flags(dev))


def drop_capabilities() -> None:
    """Clear the bounding set and the permitted/effective/inheritable sets (``capset`` with zeros)."""
    import ctypes

    for cap in range(_CAP_LAST_CAP_GUESS + 1):
        if _lib().prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break  # EINVAL past the last capability this kernel knows

    class _Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class _Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    _check(_lib().capset(ctypes.byref(header), data), "capset")


def drop_to_uid(uid: int, gid: int) -> None:
    """As root: switch to ``uid``/``gid`` with no supplementary groups (loses every capability)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
