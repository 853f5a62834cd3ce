"""Free TCP ports on this host: the one place the kit asks the OS for a port (bind to port 0).

A port found free can be taken by another process before it is used (racy by nature): callers use it at
once, and the launchers that can retry on ``address already in use`` do so.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct TCP ports on ``host`` that were free a moment ago (all sockets held open until all are
    chosen, so the OS cannot hand out the same port twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def port_is_free(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound now (SO_REUSEADDR, as servers bind: TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
