"""Who is at the other end of a loopback TCP connection: :func:`peer_uid`, :func:`peer_is_this_process`.

A debugger's bridges listen on a loopback port for a moment (a debug adapter's
connection, an editor's): any local user could connect to such a port. The kernel
says whose a local connection's other socket is (``/proc/net/tcp``: its owner's uid,
its inode; ``/proc/self/fd``: the sockets of this process), so a bridge accepts only
its own process (the node's pydevd) or its own user (the editor), and closes others.
"""

from __future__ import annotations

import contextlib
import os
import socket

__all__ = ["peer_is_this_process", "peer_uid"]


def _hex(address: tuple[str, int] | tuple[str, int, int, int], family: int) -> str:
    """``/proc/net/tcp``'s form of an address: the IP in host byte order, in hex, and the port."""
    packed = socket.inet_pton(family, address[0])
    if family == socket.AF_INET:
        ip = packed[::-1].hex().upper()
    else:  # four 32-bit words, each in host (little-endian) order
        ip = "".join(packed[i : i + 4][::-1].hex().upper() for i in range(0, 16, 4))
    return f"{ip}:{address[1]:04X}"


def _peer_row(conn: socket.socket) -> tuple[int, int] | None:
    """(uid, inode) of the socket at the other end of ``conn`` (a local TCP connection); None if the
    kernel lists none (it is not local, or it has closed)."""
    family = conn.family
    table = "/proc/net/tcp" if family == socket.AF_INET else "/proc/net/tcp6"
    theirs, ours = _hex(conn.getpeername(), family), _hex(conn.getsockname(), family)
    with contextlib.suppress(OSError), open(table) as f:
        next(f, None)
        for line in f:
            cols = line.split()
            if len(cols) > 9 and cols[1] == theirs and cols[2] == ours:
                return int(cols[7]), int(cols[9])
    return None


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of local connection ``conn`` (None: not known)."""
    row = _peer_row(conn)
    return None if row is None else row[0]


def peer_is_this_process(conn: socket.socket) -> bool:
    """Whether the other end of local connection ``conn`` is a socket of this very process."""
    row = _peer_row(conn)
    if row is None:
        return False
    wanted = f"socket:[{row[1]}]"
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == wanted:
                return True
    return False
