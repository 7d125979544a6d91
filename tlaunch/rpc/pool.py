"""A client's connections to its server: idle ones for the next call, busy ones in calls, and
at most one on its way, opened ahead of any call (:meth:`Pool.open_ahead`).

Which server is the client's (:class:`~tlaunch.rpc.client.RPCClient` resolves
it): :attr:`Pool.address`. A connection to another address (a server that
moved) is closed, never handed out.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from tlaunch.errors import RPCError
from tlaunch.rpc.framing import Connection

__all__ = ["Pool"]

# A connection used this recently is not checked for a vanished server (a poll, ~0.9 us): a loop
# of calls keeps its fast path, and no server dies, is restarted and is called again within it.
# At 0.2 s, a call made 0.18 s after the last, to a server killed and restarted meanwhile (its
# EOF pending), went over the dead connection and failed "may or may not have run".
_FRESH = 0.01
# Connections opened ahead at once, in a process: a launcher holding handles of many nodes
# that register together does not shake hands with them all at the same moment.
_AHEAD = threading.BoundedSemaphore(8)


class Pool:
    """The connections of the client of ``name``; ``opener(address)`` opens one."""

    def __init__(self, name: str, opener: Callable[[str], Connection]) -> None:
        self.address: str | None = None
        self._name = name
        self._open = opener
        self._lock = threading.Lock()
        self.idle: list[Connection] = []
        self.busy: set[Connection] = set()
        self._closed = False
        self._ahead: threading.Event | None = None  # set once the connection opened ahead is ready

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def take_idle(self) -> Connection | None:
        """An idle connection to :attr:`address` whose server is still there, now busy; else None.

        Raises:
            RPCError: the pool is closed.
        """
        with self._lock:
            if self._closed:
                raise RPCError(f"the client of {self._name!r} is closed")
            while self.idle:
                conn = self.idle.pop()
                if conn.peer == self.address and (
                    time.monotonic() - conn.last_used < _FRESH or not conn.readable(0)
                ):
                    self.busy.add(conn)
                    return conn
                conn.close()  # its server went away (EOF pending) or moved
        return None

    def take_ahead(self, timeout: float) -> Connection | None:
        """The connection opened ahead (waiting up to ``timeout`` s while it is on its way), or
        another idle one, now busy; None if there is none."""
        ahead = self._ahead
        if ahead is not None:
            ahead.wait(timeout)
        return self.take_idle()

    def add_busy(self, conn: Connection) -> None:
        """Count ``conn``, opened for a call, as busy."""
        with self._lock:
            self.busy.add(conn)

    def give_back(self, conn: Connection, ok: bool) -> None:
        """A call is done with ``conn``: idle again if it is sound (``ok``) and its server's; else closed."""
        with self._lock:
            self.busy.discard(conn)
            if ok and not self._closed and conn.peer == self.address:
                conn.last_used = time.monotonic()
                self.idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection, and any opened ahead once it is; end the busy ones (their
        calls fail and close them: :meth:`give_back`); idempotent."""
        with self._lock:
            self._closed = True
            idle, busy = self.idle, list(self.busy)
            self.idle = []
        for c in busy:
            c.shutdown()  # a call's thread may be inside OpenSSL on it: see Connection.shutdown
        for c in idle:
            c.close()

    def idle_descriptors(self) -> list[int]:
        """The descriptors of the idle connections (each one's socket, and its Unix socket if it
        has one): what a process forked to go on with them keeps open (:meth:`hand_off`)."""
        with self._lock:
            socks = [s for c in self.idle for s in (c.sock, c.fds) if s is not None]
        return [s.fileno() for s in socks]

    def hand_off(self) -> None:
        """Give up every idle connection without a word to the server: a process forked with
        them goes on with them (:meth:`RPCClient.hand_off`). Only their descriptors are closed
        here: no TLS record is written (SSLSocket's close sends no close_notify), and the peer,
        which the other process still holds, sees nothing."""
        with self._lock:
            idle, self.idle = self.idle, []
        for c in idle:
            with contextlib.suppress(OSError):
                c.sock.close()

    def open_ahead(self, address: str) -> None:
        """Open a connection to ``address`` now, in a thread of its own, for the next call.

        For a pool with no connection yet whose server has just said where it is (its
        registration): a call that comes meanwhile takes it (:meth:`take_ahead`) rather
        than opening another. One that cannot be opened is dropped: the call connects by
        itself, and says why it cannot. Returns at once.
        """
        with self._lock:
            if self._closed or self.idle or self.busy or self._ahead is not None:
                return
            if self.address is not None and self.address != address:
                return  # a server that moved: a call finds out for itself (ServerRestartedError)
            if not _AHEAD.acquire(blocking=False):  # enough on their way: a call connects itself
                return
            self.address = address
            self._ahead = ahead = threading.Event()
        try:
            threading.Thread(
                target=self._opened_ahead, args=(address, ahead), name="tlaunch-connect-ahead", daemon=True
            ).start()
        except BaseException:  # no thread to be had (the interpreter is ending)
            self._opened_ahead(None, ahead)
            raise

    def _opened_ahead(self, address: str | None, ahead: threading.Event) -> None:
        conn: Connection | None = None
        try:
            if address is not None:
                conn = self._open(address)
        except Exception:  # a call that needs the server connects itself, and says why it cannot
            pass
        finally:
            _AHEAD.release()
            with self._lock:
                self._ahead = None
                if conn is not None and not self._closed and conn.peer == self.address:
                    conn.last_used = time.monotonic()
                    self.idle.append(conn)
                    conn = None
            ahead.set()
        if conn is not None:
            conn.close()
