"""One trainer rank: ``torchrun ... -m areal_cli.trainer.worker`` (protocol: :mod:`areal_cli.trainer.group`).

Every rank: writes its output to ``$AREAL_TRAINER_LOG_DIR/trainer-rank{RANK}.log`` (when set), dies with its
parent (torchrun) via ``PR_SET_PDEATHSIG``, joins the default process group
(:func:`areal_cli.trainer.cpu_compat.init_distributed`, timeout ``$AREAL_TRAINER_TIMEOUT_S``, default 1800 s),
then loops: receive a message (rank 0 from the controller, the others by ``broadcast_object_list``), run it,
gather the outcomes on rank 0, which replies. Rank 0 connects to ``$AREAL_CONTROLLER_ADDR`` with the key in
``$AREAL_CONTROLLER_AUTHKEY_FILE`` (retrying until ``$AREAL_TRAINER_CONNECT_S``, default 600 s, for attach
mode where the controller may start later). The controller gone (connection closed) = stop.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Client

from areal_cli.trainer.calls import build_engine, run_call
from areal_cli.trainer.group import (
    ENV_ADDR,
    ENV_AUTHKEY_FILE,
    ENV_LOG_DIR,
    ENV_TIMEOUT,
    PING_S,
    read_authkey,
    recv_msg,
    send_msg,
)


def _redirect_output(rank: int) -> None:
    log_dir = os.environ.get(ENV_LOG_DIR)
    if not log_dir:
        return
    os.makedirs(log_dir, exist_ok=True)
    fd = os.open(os.path.join(log_dir, f"trainer-rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: torchrun still stops its workers itself
        pass


def _connect(timeout_s: float):
    addr = os.environ.get(ENV_ADDR, "")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise RuntimeError(f"{ENV_ADDR}={addr!r}: expected host:port")
    key = read_authkey(os.environ.get(ENV_AUTHKEY_FILE))
    t_end = time.monotonic() + timeout_s
    while True:
        try:
            return Client((host, int(port)), authkey=key)
        except (ConnectionRefusedError, socket.timeout, OSError):
            if time.monotonic() > t_end:
                raise
            time.sleep(0.5)


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    _redirect_output(rank)
    _die_with_parent()
    import torch
    import torch.distributed as dist

    from areal_cli.trainer import cpu_compat

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cpu_compat.init_distributed(timeout_s=float(os.environ.get(ENV_TIMEOUT, "1800")))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"trainer rank {rank}/{world} pid {os.getpid()} on {socket.gethostname()}", flush=True)
    pids: list = [None] * world
    dist.all_gather_object(pids, (os.getpid(), socket.gethostname()))
    conn = None
    if rank == 0:
        conn = _connect(float(os.environ.get("AREAL_TRAINER_CONNECT_S", "600")))
        send_msg(conn, ("hello", {"world": world, "pids": [p for p, _ in pids], "hosts": [h for _, h in pids]}))
    engine = None
    while True:
        box = [None]
        if rank == 0:
            try:
                box[0] = recv_msg(conn) if conn.poll(PING_S) else ("ping",)
            except (EOFError, OSError):
                box[0] = ("stop",)  # the controller is gone
        dist.broadcast_object_list(box, src=0)
        msg = box[0]
        kind = msg[0]
        if kind == "stop":
            break
        if kind == "ping":
            continue
        result, error = None, None
        try:
            if kind == "init":
                _, factory, kwargs = msg
                engine = build_engine(factory, kwargs)
            elif kind == "call":
                _, name, args, kwargs = msg
                result = run_call(engine, name, args, kwargs)
            else:
                raise ValueError(f"unknown message {kind!r}")
        except Exception as e:  # noqa: BLE001 - reported to the controller with this rank
            error = (rank, type(e).__name__, str(e), traceback.format_exc())
            print(error[3], file=sys.stderr, flush=True)
        errors: list | None = [None] * world if rank == 0 else None
        dist.gather_object(error, errors, dst=0)
        if rank == 0:
            failed = [e for e in errors if e is not None]
            try:
                send_msg(conn, ("error", failed) if failed else ("ok", result))
            except (EOFError, OSError):
                pass  # the controller is gone: the next recv says stop
            except Exception as e:  # noqa: BLE001 - an unpicklable result
                send_msg(conn, ("error", [(0, type(e).__name__, f"cannot send the result back: {e}",
                                      traceback.format_exc())]))
    if conn is not None:
        conn.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
