"""Large buffers between processes of one host, as sealed memory files.

When both ends of a connection see the same ``/dev/shm`` as the same user
(same kernel boot, same tmpfs, same uid: :func:`host_key`, compared when the
connection opens), the connection gets a Unix socket beside its TLS one, and a
large out-of-band buffer does not cross TLS and the loopback:

* the sender writes it into a fresh memory file (``memfd_create``, never in
  any directory) and *seals* it: no write, no shrinking, no growing, by
  anyone, from then on (``F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW``), and
  passes the descriptor over the Unix socket (``SCM_RIGHTS``); the message on
  TLS carries only the buffer's size, flagged;
* the receiver checks that the descriptor is a regular file of exactly the
  announced size carrying those seals, and maps it privately: its arrays are
  its own and writable (copy on write), and neither the sender nor anyone else
  can change the pages under them or shrink the file (no ``SIGBUS``); nothing
  is copied on the way in.

Nothing is left behind: a file has no name, and the kernel frees it with its
last descriptor or mapping; descriptors in flight when a connection closes go
with the socket. Only the Unix socket's rendezvous has a name, for the moment
between the greeting and the peer's connect: ``/dev/shm/tlaunch-<pid>-<128
random bits>``, mode 0600, removed once accepted (:func:`sweep` removes those
of a server that died in that moment).

Measured on the 2-core test VM, a 256 MiB numpy round trip between two
processes: ~590 MiB/s over TLS, ~1.1 GiB/s through 0600 files copied on
arrival, ~2.1 GiB/s through files mapped unsealed (which a sender could change
or shrink under the receiver), and this way: see ``docs/benchmarks.md``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import mmap
import os
import re
import secrets
import select
import socket
import stat
import struct
import sys
import time
import weakref

from tlaunch.procs import pid_exists
from tlaunch.rpc.buffers import populate_ahead

__all__ = [
    "MIN_SIZE",
    "Rendezvous",
    "host_key",
    "join",
    "offer",
    "read_into",
    "receive_fds",
    "seal",
    "send_fds",
    "sweep",
    "take",
]

MIN_SIZE = 512 << 10  # buffers from this size up travel as sealed memory files
_DIR = "/dev/shm"
_NAME = re.compile(rb"tlaunch-(\d+)-[0-9a-f]{32}")
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW if hasattr(fcntl, "F_SEAL_WRITE") else 0
_RECORD = struct.Struct("!QI")  # the message's request id, the number of descriptors in this record
_MAX_FDS = 250  # per record (the kernel's SCM_MAX_FD is 253)
_UCRED = struct.Struct("3i")  # pid, uid, gid

_key: bytes | None = None
_key_known = False

_mmap = _munmap = None
_MAP_FAILED = ctypes.c_void_p(-1).value
if sys.implementation.name == "cpython":
    with contextlib.suppress(OSError, AttributeError):
        _libc = ctypes.CDLL(None, use_errno=True)
        _mmap, _munmap = _libc.mmap, _libc.munmap
        _mmap.restype = ctypes.c_void_p
        _mmap.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        )
        _munmap.restype = ctypes.c_int
        _munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)


def host_key() -> bytes | None:
    """What two processes must share to exchange buffers here; None where they cannot."""
    global _key, _key_known
    if _key_known:
        return _key
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
        st = os.stat(_DIR)
        usable = (
            stat.S_ISDIR(st.st_mode)
            and os.access(_DIR, os.W_OK | os.X_OK)
            and hasattr(os, "memfd_create")
            and _SEALS != 0
            and hasattr(socket, "SCM_RIGHTS")
        )
    except OSError:
        usable = False
    if usable:
        _key = hashlib.sha256(b"%s %d %d %d" % (boot, st.st_dev, st.st_ino, os.getuid())).digest()
    _key_known = True
    return _key


# -- the Unix socket beside a connection ------------------------------------------


class Rendezvous:
    """A server's offer of a Unix socket to the client that greeted it: a fresh 0600 name."""

    def __init__(self) -> None:
        self.name = f"tlaunch-{os.getpid()}-{secrets.token_hex(16)}".encode()
        self.path = os.path.join(_DIR, self.name.decode())
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
                select.select([self._listener, tls], [], [], timeout)
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
    if not _NAME.fullmatch(name):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(os.path.join(_DIR, name.decode()))
    except OSError:
        sock.close()
        return None
    return sock


# -- buffers --------------------------------------------------------------------------


def seal(view: memoryview) -> int | None:
    """A sealed memory file holding a copy of ``view``; its descriptor, or None (send it inline)."""
    try:
        fd = os.memfd_create("tlaunch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        done, n = 0, view.nbytes
        while done < n:
            done += os.pwrite(fd, view[done:], done)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS | fcntl.F_SEAL_SEAL)
    except OSError:  # out of memory: the caller sends the buffer inline
        os.close(fd)
        return None
    return fd


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


def _check(fd: int, n: int) -> None:
    """Refuse anything but a regular file of exactly ``n`` bytes that nobody can change."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != n:
        raise ValueError(f"a shared buffer is not the {n} bytes announced")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise ValueError("a shared buffer is not a sealed memory file") from exc
    if seals & _SEALS != _SEALS:
        raise ValueError("a shared buffer is not sealed against writing and resizing")


def take(fd: int, n: int) -> memoryview:
    """The sealed file ``fd`` of ``n`` bytes, mapped privately (the caller's to change); closes ``fd``.

    The mapping holds no descriptor (``mmap.mmap`` keeps a copy of its file's
    descriptor open as long as it lives: a program keeping a thousand received
    arrays would run out of descriptors); it is unmapped once nothing uses it.

    Raises:
        ValueError: it is not a sealed memory file of ``n`` bytes.
        OSError: it cannot be mapped.
    """
    try:
        _check(fd, n)
        return _map_private(fd, n)
    finally:
        os.close(fd)


def _map_private(fd: int, n: int) -> memoryview:
    if _mmap is None or _munmap is None:  # not CPython: a mapping that keeps a descriptor
        return memoryview(mmap.mmap(fd, n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))
    addr = _mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    memory = (ctypes.c_char * n).from_address(addr)
    weakref.finalize(memory, _munmap, addr, n)  # when the last view of it is gone
    return memoryview(memory).cast("B")


def read_into(fd: int, target: memoryview) -> None:
    """Copy the sealed file ``fd`` into ``target`` (a fresh ``bytes``, say); closes ``fd``.

    Raises:
        ValueError: it is not a sealed memory file of ``target``'s size.
        OSError: it cannot be read.
    """
    n = target.nbytes
    try:
        _check(fd, n)
        done = 0
        while done < n:
            end = populate_ahead(target, done, n)
            got = os.preadv(fd, [target[done:end]], done)
            if not got:
                raise ValueError("a shared buffer ended early")
            done += got
    finally:
        os.close(fd)


def sweep(min_age: float = 60.0) -> int:
    """Remove this user's rendezvous names whose server died; how many were removed."""
    removed = 0
    try:
        entries = list(os.scandir(_DIR))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        m = _NAME.fullmatch(entry.name.encode())
        if not m:
            continue
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            if st.st_uid != os.getuid() or now - st.st_mtime < min_age or pid_exists(int(m.group(1))):
                continue
            os.unlink(entry.path)
            removed += 1
    return removed
