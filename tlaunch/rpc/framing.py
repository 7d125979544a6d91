"""Messages on a TLS connection: a fixed header, buffer lengths, then the buffers.

A message is a kind, a request id and a list of buffers (a pickle and its
out-of-band buffers, see :mod:`tlaunch.rpc.wire`). Small messages leave in one
write; large buffers are written straight from the caller's memory and read
straight into a fresh buffer of the receiver (which then owns it: arrays built
on it are writable).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import ssl
import struct
from collections.abc import Sequence

from tlaunch.rpc import fdpass, shm
from tlaunch.rpc.buffers import fresh_bytes, populate_ahead, receive_buffer, writable
from tlaunch.rpc.readiness import Readiness
from tlaunch.rpc.wire import Buffer, first_bytes_buffer

__all__ = ["MAX_MESSAGE", "Connection", "ProtocolError", "small_frame"]

_HEAD = struct.Struct("!2sBBQI")  # magic, version, kind, request id, number of buffers
_HEAD2 = struct.Struct("!2sBBQIQQ")  # the header of a two-buffer message, with the sizes
_MAGIC = b"TL"
_VERSION = 1
_MAX_BUFFERS = 1 << 20
_SMALL = 64 << 10
_READ_CHUNK = 16 << 10  # one TLS record at most per read
_EMPTY = memoryview(b"")
_SHARED = 1 << 63  # in a buffer's size: it travels as sealed memory files over the Unix socket,
_PIECES = 56  # as many as bits 56-62 say, plus one
_SIZE = (1 << _PIECES) - 1  # the size proper of a shared buffer
# No message may claim more bytes than this host has memory: the claim is refused
# before anything is allocated (a peer with the keys cannot make a node commit
# memory it announces but never sends; memory is committed as data arrives).
MAX_MESSAGE = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class ProtocolError(ConnectionError):
    """The peer sent something that is not a tlaunch message."""


class Connection:
    """One authenticated TLS connection carrying framed messages."""

    __slots__ = ("_buf", "_pos", "_ready", "fds", "last_used", "peer", "sock")

    def __init__(self, sock: ssl.SSLSocket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._buf = bytearray()
        self._pos = 0
        self._ready = Readiness()
        self.last_used = 0.0
        # A Unix socket to the same peer, for sealed memory files (tlaunch.rpc.shm);
        # None unless the peer shares this host as this user.
        self.fds: socket.socket | None = None

    @property
    def shm(self) -> bool:
        """Whether large buffers go to the peer as sealed memory files (:mod:`tlaunch.rpc.shm`)."""
        return self.fds is not None

    # -- writing ----------------------------------------------------------
    def send(self, kind: int, req_id: int, buffers: Sequence[Buffer]) -> None:
        """Write one message."""
        frame = small_frame(kind, req_id, buffers)
        if frame is not None:
            self._send_small(frame)
            return
        views = [memoryview(b).cast("B") for b in buffers]
        sizes = [v.nbytes for v in views]
        if self.fds is not None:
            self._send_sealed(req_id, views, sizes)
        head = _HEAD.pack(_MAGIC, _VERSION, kind, req_id, len(views))
        head += struct.pack(f"!{len(views)}Q", *sizes)
        if all(v.nbytes <= _SMALL for v in views):
            self.sock.sendall(b"".join([head, *views]))
            return
        pending: list[Buffer] = [head]
        for v in views:
            if v.nbytes <= _SMALL:
                pending.append(v)
                continue
            self.sock.sendall(b"".join(pending))
            pending = []
            self.sock.sendall(v)
        if pending:
            self.sock.sendall(b"".join(pending))

    def _send_sealed(self, req_id: int, views: list[memoryview], sizes: list[int]) -> None:
        """Pass the large buffers of a message as sealed files before the message itself."""
        assert self.fds is not None
        fds: list[int] = []
        try:
            for i, v in enumerate(views):
                if v.nbytes >= shm.MIN_SIZE and (files := shm.seal(v)) is not None:
                    fds += files
                    views[i] = _EMPTY
                    sizes[i] = v.nbytes | _SHARED | (len(files) - 1) << _PIECES
            if fds:
                fdpass.send_fds(self.fds, req_id, fds)
        finally:
            for fd in fds:  # the peer holds them now (or the message never leaves)
                os.close(fd)

    def _send_small(self, data: bytes) -> None:
        # A blocking TLS socket writes all of it in one call (OpenSSL without partial
        # writes); sendall's wrapping costs more than the write for small messages.
        sent = self.sock.send(data)
        if sent < len(data):
            self.sock.sendall(memoryview(data)[sent:])

    def send_frames(self, frames: Sequence[bytes]) -> None:
        """Write whole frames of :func:`small_frame` in one write."""
        self._send_small(frames[0] if len(frames) == 1 else b"".join(frames))

    def send_many(self, messages: Sequence[tuple[int, int, Sequence[Buffer]]]) -> None:
        """Write several messages, the small ones together in one write."""
        batch: list[bytes] = []
        for kind, req_id, buffers in messages:
            frame = small_frame(kind, req_id, buffers)
            if frame is not None:
                batch.append(frame)
                continue
            if batch:
                self._send_small(b"".join(batch))
                batch = []
            self.send(kind, req_id, buffers)
        if batch:
            self._send_small(b"".join(batch))

    # -- reading ----------------------------------------------------------
    def buffered(self) -> bool:
        """Whether part of a message is already read (no system call)."""
        return self._pos < len(self._buf) or bool(self.sock.pending())

    def readable(self, timeout: float) -> bool:
        """Whether a message has started to arrive, waiting up to ``timeout`` s."""
        if self._pos < len(self._buf) or self.sock.pending():
            return True
        try:
            return self._ready.wait(self.sock, timeout)
        except ValueError as exc:  # closed by another thread (fileno() is -1)
            raise ConnectionAbortedError(f"the connection to {self.peer} was closed") from exc

    def recv(self) -> tuple[int, int, list[memoryview]]:
        """Read one whole message: (kind, request id, buffers).

        Raises:
            EOFError: the peer closed the connection cleanly between messages.
            ProtocolError: malformed data.
            OSError: the connection broke.
        """
        if self._pos == len(self._buf):
            # The common case: nothing buffered. One read often holds the whole message.
            chunk = self.sock.recv(_READ_CHUNK)
            if not chunk:
                raise EOFError(f"{self.peer} closed the connection")
            message = self._whole(chunk)
            if message is not None:
                return message
            self._buf = bytearray(chunk)
            self._pos = 0
        message = self._buffered_message()
        if message is not None:
            return message
        kind, req_id, nbuf = self._head(self._read_small(_HEAD.size, eof_ok=True), 0)
        sizes = struct.unpack(f"!{nbuf}Q", self._read_small(8 * nbuf)) if nbuf else ()
        claimed = sum(n & _SIZE if n & _SHARED else n for n in sizes)
        if claimed > MAX_MESSAGE:
            raise ProtocolError(
                f"{self.peer} announced a message of {claimed} bytes, more than this host's memory"
            )
        sealed = self._sealed_files(req_id, sum(_files(n) for n in sizes if n & _SHARED))
        try:
            return kind, req_id, self._read_buffers(sizes, sealed)
        except MemoryError as exc:
            raise ProtocolError(f"no memory for the {claimed} bytes {self.peer} announced") from exc
        finally:
            for fd in sealed:  # those not taken (an error on the way)
                os.close(fd)

    def _sealed_files(self, req_id: int, count: int) -> list[int]:
        """The descriptors of the ``count`` sealed files of message ``req_id`` (none: no call)."""
        if not count:
            return []
        if self.fds is None:
            raise ProtocolError(f"{self.peer} sent a shared-memory buffer without sharing this host")
        try:
            return fdpass.receive_fds(self.fds, req_id, count)
        except ValueError as exc:
            raise ProtocolError(f"{self.peer}'s shared buffers could not be received: {exc}") from exc

    def _read_buffers(self, sizes: Sequence[int], sealed: list[int]) -> list[memoryview]:
        out: list[memoryview] = []
        bytes_from = len(sizes)
        for i, n in enumerate(sizes):
            if n & _SHARED:
                files = sealed[: _files(n)]
                del sealed[: len(files)]
                out.append(self._take_sealed(files, n & _SIZE, as_bytes=i >= bytes_from))
            elif i >= bytes_from:
                out.append(self._read_into(fresh_bytes(n), n))
            else:
                out.append(self._read_into(receive_buffer(n), n))
            if i == 1 and len(sizes) > 2:
                bytes_from = first_bytes_buffer(out[1])
        return out

    def _whole(self, chunk: bytes) -> tuple[int, int, list[memoryview]] | None:
        """The message in ``chunk`` if it is exactly one message of the common shape
        (a small pickle and its buffer counts), as views of ``chunk``; else None."""
        size = len(chunk)
        if size < _HEAD2.size:
            return None
        magic, version, kind, req_id, nbuf, a, b = _HEAD2.unpack_from(chunk)
        if nbuf != 2 or magic != _MAGIC or version != _VERSION or _HEAD2.size + a + b != size:
            return None
        view = memoryview(chunk)
        return kind, req_id, [view[_HEAD2.size : _HEAD2.size + a], view[_HEAD2.size + a :]]

    def _buffered_message(self) -> tuple[int, int, list[memoryview]] | None:
        """The next message if it is small and already read whole (a burst's second, third...)."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _HEAD.size:
            return None
        kind, req_id, nbuf = self._head(buf, pos)
        at = pos + _HEAD.size + 8 * nbuf
        if len(buf) < at:
            return None
        sizes = struct.unpack_from(f"!{nbuf}Q", buf, pos + _HEAD.size)
        if at + sum(sizes) > len(buf) or any(n > _SMALL for n in sizes):
            return None  # not all here yet, or a large buffer (read into a fresh buffer of its own)
        out = []
        for n in sizes:
            out.append(memoryview(buf[at : at + n]))
            at += n
        self._pos = at
        return kind, req_id, out

    def _head(self, data: bytes | bytearray, pos: int) -> tuple[int, int, int]:
        """(kind, request id, number of buffers) of the header at ``pos``; checked."""
        magic, version, kind, req_id, nbuf = _HEAD.unpack_from(data, pos)
        if magic != _MAGIC or version != _VERSION or nbuf > _MAX_BUFFERS:
            raise ProtocolError(f"{self.peer} sent a header that is not tlaunch's")
        return kind, req_id, nbuf

    def _fill(self, at_least: int, eof_ok: bool = False) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        while len(self._buf) < at_least:
            chunk = self.sock.recv(_READ_CHUNK)
            if not chunk:
                if eof_ok and not self._buf:
                    raise EOFError(f"{self.peer} closed the connection")
                raise ConnectionResetError(f"{self.peer} closed the connection mid-message")
            self._buf += chunk

    def _read_small(self, n: int, eof_ok: bool = False) -> bytes:
        if len(self._buf) - self._pos < n:
            self._fill(n, eof_ok)
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return out

    def _read_into(self, target: bytearray | mmap.mmap | bytes, n: int) -> memoryview:
        """Fill ``target`` (``n`` bytes, fresh) from the connection; a view of it."""
        out = memoryview(target)
        mv = writable(target)
        have = min(n, len(self._buf) - self._pos)
        mv[:have] = self._buf[self._pos : self._pos + have]
        self._pos += have
        got = have
        ready = populate_ahead(mv, got, n)
        while got < n:
            if got >= ready:
                ready = populate_ahead(mv, got, n)
            r = self.sock.recv_into(mv[got:ready], ready - got)
            if not r:
                raise ConnectionResetError(f"{self.peer} closed the connection mid-message")
            got += r
        return out

    def _take_sealed(self, fds: list[int], n: int, as_bytes: bool) -> memoryview:
        """The buffer in files ``fds`` (``n`` bytes): mapped, or copied into a ``bytes``
        (``as_bytes``); closes ``fds``."""
        try:
            if not as_bytes:
                return shm.take(fds, n)
            try:
                fresh = fresh_bytes(n)
            except BaseException:
                shm.close_files(fds)
                raise
            shm.read_into(fds, writable(fresh))
            return memoryview(fresh)
        except (OSError, ValueError) as exc:
            raise ProtocolError(f"{self.peer}'s shared buffer could not be read: {exc}") from exc

    def shutdown(self) -> None:
        """End the connection now, from any thread, but keep its descriptors: a thread reading
        or writing it gets an error at once, the peer an end; the thread using it then
        calls :meth:`close`.

        Closed under a thread that is inside OpenSSL on it, a socket's number is free for the
        next socket this process opens, and OpenSSL reads and writes by number: the fatal
        alert it sends on the end it then reads (24 bytes) went into a new connection's
        stream, whose handshake failed (``tests/test_rpc_shm.py``, ~4 % of runs, 2026-11-26).
        """
        with contextlib.suppress(OSError):
            # The socket's own shutdown, not SSLSocket's: that one first drops the TLS object,
            # and a write in that moment would leave as plaintext.
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        if self.fds is not None:
            with contextlib.suppress(OSError):
                self.fds.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the connection (idempotent); sealed files in flight go with it.

        Only where no other thread may be reading or writing it (else :meth:`shutdown`).
        """
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.fds is not None:
            with contextlib.suppress(OSError):  # wakes a thread blocked receiving descriptors
                self.fds.shutdown(socket.SHUT_RDWR)
            self.fds.close()


def _files(size: int) -> int:
    """How many sealed files a shared buffer's flagged ``size`` says it travels in."""
    return ((size >> _PIECES) & 0x7F) + 1


def small_frame(kind: int, req_id: int, buffers: Sequence[Buffer]) -> bytes | None:
    """The whole frame of the common small message (a pickle and its buffer counts), else None."""
    if len(buffers) != 2 or type(buffers[0]) is not bytes or type(buffers[1]) is not bytes:
        return None
    a, b = buffers
    if len(a) > _SMALL:
        return None
    return _HEAD2.pack(_MAGIC, _VERSION, kind, req_id, 2, len(a), len(b)) + a + b
