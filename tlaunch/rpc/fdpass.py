"""Descriptors passed beside a connection: the Unix socket of two processes of one host.

A server offers a Unix socket to a client whose greeting shows that it shares
this host's ``/dev/shm`` as the same user (:func:`tlaunch.rpc.shm.host_key`):
it listens at a fresh name there (``tlaunch-<pid>-<128 random bits>``, mode
0600 before it listens), sends the name over the authenticated TLS connection,
accepts the client's connection (checking its uid) and removes the name. The
sealed memory files of large buffers (:mod:`tlaunch.rpc.shm`) then travel on
it, each message's with a record of its request id and their number.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
import time

from tlaunch.procs import pid_exists
from tlaunch.rpc.readiness import wait_readable

__all__ = ["DIR", "NAME", "Rendezvous", "join", "offer", "receive_fds", "send_fds", "sweep"]

DIR = "/dev/shm"
NAME = rb"tlaunch-(\d+)-[0-9a-f]{32}"  # a rendezvous's name (compiled where first used)

_RECORD = struct.Struct("!QI")  # the message's request id, the number of descriptors in this record
_MAX_FDS = 250  # per record (the kernel's SCM_MAX_FD is 253)
_UCRED = struct.Struct("3i")  # pid, uid, gid


class Rendezvous:
    """A server's offer of a Unix socket to the client that greeted it: a fresh 0600 name."""

    def __init__(self) -> None:
        self.name = f"tlaunch-{os.getpid()}-{os.urandom(16).hex()}".encode()
        self.path = os.path.join(DIR, self.name.decode())
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._listener.bind(self.path)
            try:
                os.chmod(self.path, 0o600)  # before listen(): until then, a connect is refused
                self._listener.listen(1)
            except BaseException:
                os.unlink(self.path)
                raise
        except BaseException:
            self._listener.close()
            raise

    def accept(self, tls: socket.socket, buffered: bool, timeout: float) -> socket.socket | None:
        """The client's Unix socket, or None if it went on over TLS without one.

        The client connects before it sends anything more over ``tls``, so once
        ``tls`` is readable (or ``buffered``: bytes already read), a connection
        that is not queued will not come. Another user's connection (the name is
        0600, so only root could make one) is refused.
        """
        try:
            if not buffered:
                wait_readable([self._listener, tls], timeout)
            self._listener.setblocking(False)
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return None
            _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            if uid != os.getuid():
                sock.close()
                return None
            sock.setblocking(True)
            return sock
        finally:
            self.close()

    def close(self) -> None:
        """Remove the name and stop listening (idempotent)."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self._listener.close()


def offer() -> Rendezvous | None:
    """A rendezvous for a client's Unix socket; None if none can be made here."""
    try:
        return Rendezvous()
    except OSError:
        return None


def join(name: bytes) -> socket.socket | None:
    """Connect to a server's rendezvous ``name`` (checked); None if that fails."""
    if not re.fullmatch(NAME, name):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(os.path.join(DIR, name.decode()))
    except OSError:
        sock.close()
        return None
    return sock


def send_fds(sock: socket.socket, req_id: int, fds: list[int]) -> None:
    """Pass ``fds`` (the sealed files of message ``req_id``, in order) over ``sock``."""
    for at in range(0, len(fds), _MAX_FDS):
        part = fds[at : at + _MAX_FDS]
        socket.send_fds(sock, [_RECORD.pack(req_id, len(part))], part)


def receive_fds(sock: socket.socket, req_id: int, count: int) -> list[int]:
    """The ``count`` descriptors passed with message ``req_id``.

    Raises:
        ValueError: the peer passed something else (what it passed is closed).
        OSError: the socket broke.
    """
    fds: list[int] = []
    try:
        while len(fds) < count:
            data, got, flags, _ = socket.recv_fds(sock, _RECORD.size + 1, _MAX_FDS)
            fds.extend(got)
            if not data:
                raise ValueError("the peer closed its descriptor socket")
            if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC) or len(data) != _RECORD.size:
                raise ValueError("a malformed descriptor record")
            rid, n = _RECORD.unpack(data)
            if rid != req_id or n != len(got) or len(fds) > count:
                raise ValueError(f"descriptors for message {rid} where {count} of message {req_id} were due")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def sweep(min_age: float = 60.0) -> int:
    """Remove this user's rendezvous names whose server died before its peer connected; how many."""
    removed = 0
    try:
        entries = list(os.scandir(DIR))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        m = re.fullmatch(NAME, entry.name.encode())
        if not m:
            continue
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            if st.st_uid != os.getuid() or now - st.st_mtime < min_age or pid_exists(int(m.group(1))):
                continue
            os.unlink(entry.path)
            removed += 1
    return removed
