"""Client side of a futures channel: many calls in flight on one pair of connections.

Requests leave on one connection from the caller's thread; replies come back on
the other (see :mod:`tlaunch.rpc.server`). Who reads the replies decides the
speed, since every hand-off between threads costs a wake-up:

* A thread that waits for a future (``result()``, ``exception()``) reads the
  channel itself, completing every future whose reply it meets on the way; a
  second waiter waits for the first to finish or to complete its future.
* The process's reactor reads a channel only while one of its futures has a
  callback or a waiter of ``concurrent.futures.wait``/``as_completed`` (these
  cannot read for themselves).
* Replies nobody asks for (fire and forget) are drained by the caller once many
  calls are in flight, and by the reactor's sweep, so the server never blocks
  on a full connection.

The sweep also fails calls whose program is stopping or whose server moved.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable

from tlaunch.rpc import wire
from tlaunch.rpc.call_future import ChannelFuture, ChannelOwner
from tlaunch.rpc.framing import Connection, ProtocolError, small_frame
from tlaunch.rpc.futures import reactor
from tlaunch.rpc.wire import Buffer

__all__ = ["Channel", "ChannelFuture", "ChannelOwner"]

# ValueError: the socket was closed under a reader (the channel failed meanwhile).
_BROKEN = (OSError, EOFError, ProtocolError, ValueError)
_SLICE = 0.5  # seconds between liveness checks of a waiting reader
_DRAIN_AT = 64  # calls in flight past which a caller reads the replies already there
# Bursts. A request that starts within _BURST s of the previous one on the channel,
# with no wait for a reply in between, is part of a burst. Each write of a request
# costs the caller a system call and the TCP path, and may wake the server: so when
# the channel's last burst was waited for right after its last request (the caller
# issues a batch of futures, then waits: Launchpad's consumer pattern), the requests
# of a burst after its first are held back and leave together when the caller waits
# for any future of the channel, or at _HOLD requests. The first request of a burst
# always leaves at once. Should nobody wait after all, the reactor sends what is held
# within two ticks (futures.HOLD_TICK) and the channel stops holding back until a
# burst is again waited for at once; so a caller that issues futures and then works
# before it waits keeps the overlap.
_BURST = 200e-6
_HOLD = 16
# A waiter whose last wait for a reply was shorter than _QUICK polls for up to _SPIN
# before it sleeps: a reply written to a sleeping reader costs the server a wake-up
# and the reader the scheduler's latency (as on the server's side, see server._SPIN).
_SPIN = 50e-6
_QUICK = 200e-6


class Channel:
    """A client's futures channel to one server address."""

    def __init__(self, client: ChannelOwner, requests: Connection, replies: Connection) -> None:
        # Weakly: the reactor tracks the channel, which must not keep a dropped client
        # alive; its calls in flight hold it, and the channel closes once it is gone.
        self._owner = weakref.ref(client)
        self.requests = requests
        self.replies = replies
        self.peer = requests.peer
        self.calls: dict[int, tuple[ChannelFuture, str, float]] = {}  # request id -> (future, method, sent)
        self.lock = threading.Lock()  # calls, done, attended
        self.send_lock = threading.Lock()  # writes on ``requests``
        # Held by the one thread reading ``replies``; reentrant, since a future's
        # callback runs in the reading thread and may wait for another future.
        self.read_lock = threading.RLock()
        self._depth = 0  # read_lock's holds by its thread; > 0 while some thread reads
        self.turn = threading.Condition()  # a reader finished a batch or stopped reading
        self.turn_waiters = 0
        self.done = False
        self.attended = 0  # futures in flight with a callback or a waiter: the reactor reads for them
        self._ids = 0
        self.held: list[bytes] = []  # frames of requests held back (a burst), sent in one write
        self._held_since = 0.0
        self._last_start = 0.0  # when the last request started
        self._waited = True  # a caller waited for a reply since then
        self._hold = False  # the last burst was waited for at once: hold the next one back
        self._quick = False  # the last wait for a reply was short: poll before sleeping
        reactor().track(self)

    @property
    def client(self) -> ChannelOwner:
        """The client that opened the channel (alive while it has calls in flight)."""
        client = self._owner()
        if client is None:
            raise ReferenceError(f"the client of the channel to {self.peer} was dropped")
        return client

    def start(self, method: str, payload: list[Buffer]) -> ChannelFuture:
        """Send a request, or hold it back in a burst (see :data:`_BURST`).

        Raises:
            OSError: the request (and those held back) could not leave; it did not run.
        """
        future = ChannelFuture(self, self.client)
        now = time.monotonic()
        with self.lock:
            if self.done:
                raise ConnectionResetError(f"the channel to {self.peer} is closed")
            self._ids += 1
            req_id = self._ids
            self.calls[req_id] = (future, method, now)
            crowded = len(self.calls) > _DRAIN_AT
            burst = not self._waited and now - self._last_start < _BURST
            self._last_start = now
            self._waited = False
            frame = small_frame(wire.REQUEST, req_id, payload)
            if burst and self._hold and frame is not None and len(self.held) < _HOLD - 1:
                self.held.append(frame)
                if len(self.held) == 1:
                    self._held_since = now
                    reactor().hold(self)
                return future
        try:
            with self.send_lock:
                with self.lock:
                    held, self.held = self.held, []
                if frame is not None:
                    self.requests.send_frames([*held, frame])
                else:
                    if held:
                        self.requests.send_frames(held)
                    self.requests.send(wire.REQUEST, req_id, payload)
        except OSError as exc:
            with self.lock:
                self.calls.pop(req_id, None)
            self.lost(exc)
            raise
        if crowded:
            self.poll()  # replies nobody reads would fill the connection and stall the server
        return future

    def flush(self, waited: bool = True) -> None:
        """Send the requests held back.

        Args:
            waited: a caller waits for a reply (else: the reactor sends what
                nobody waited for, and the channel stops holding requests back).
        """
        if waited and not self._waited:
            self._waited = True
            # Holding back delays nothing if the caller waited right after its last request.
            self._hold = time.monotonic() - self._last_start < _BURST
        if self._send_held() and not waited:
            self._hold = False

    def _send_held(self) -> bool:
        """Send the requests held back; whether there were any."""
        if not self.held:
            return False
        try:
            with self.send_lock:
                with self.lock:
                    held, self.held = self.held, []
                if held:
                    self.requests.send_frames(held)
        except OSError as exc:
            self.lost(exc)
        return True

    def held_since(self) -> float | None:
        """When the oldest request held back was held; None if none is."""
        return self._held_since if self.held else None

    # -- reading --------------------------------------------------------
    def collect(self, future: ChannelFuture, timeout: float | None) -> None:
        """Read replies until ``future`` is done or ``timeout`` s pass."""
        self.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not future.completed():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            if self._acquire():
                try:
                    self._read_until(future, deadline)
                finally:
                    self._release()
                continue
            with self.turn:  # another thread is reading: wait for its batch or its turn
                if self._depth and not future.completed():
                    self.turn_waiters += 1
                    try:
                        self.turn.wait(_SLICE if remaining is None else min(_SLICE, remaining))
                    finally:
                        self.turn_waiters -= 1

    def poll(self, waited: bool = False) -> None:
        """Read the replies already arrived, if no other thread is reading.

        Args:
            waited: a caller waits (``done()``), as opposed to a drain or a sweep.
        """
        if waited:
            self.flush()
        else:
            self._send_held()
        if self.done or not self._acquire():
            return
        try:
            while self.replies.readable(0):
                self._read_one()
        except _BROKEN as exc:
            self.lost(exc)
        finally:
            self._release()

    def _read_until(self, future: ChannelFuture, deadline: float | None) -> None:
        try:
            while not future.completed():
                wait = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
                if wait <= 0:
                    return
                if not self._arrived(wait):
                    self.check()
                    continue
                self._read_one()
                if self.turn_waiters:
                    with self.turn:
                        self.turn.notify_all()
        except _BROKEN as exc:
            self.lost(exc)

    def _arrived(self, wait: float) -> bool:
        """Whether a reply starts to arrive within ``wait`` s; polls a while first if the
        last reply came soon after its wait began (the server is busy with this channel)."""
        replies = self.replies
        if replies.readable(0):
            return True
        began = time.perf_counter()
        if self._quick:
            end = began + _SPIN
            while time.perf_counter() < end:
                if replies.readable(0):
                    return True
        arrived = replies.readable(wait)
        self._quick = time.perf_counter() - began < _QUICK
        return arrived

    def _read_one(self) -> None:
        kind, req_id, buffers = self.replies.recv()
        with self.lock:
            entry = self.calls.pop(req_id, None)
            if entry is None:
                return
            future = entry[0]
            if future.attended:
                self.attended -= 1
        try:
            result = future.owner._result(kind, buffers)
        except BaseException as exc:  # a RemoteError, or a reply that does not unpickle here
            future.set_exception(exc)
        else:
            future._finish(result)

    def _acquire(self) -> bool:
        if not self.read_lock.acquire(blocking=False):
            return False
        self._depth += 1
        return True

    def _release(self) -> None:
        self._depth -= 1
        outer = not self._depth  # read before releasing: another thread may take it at once
        self.read_lock.release()
        if not outer:
            return
        if self.done:  # failed while this thread read (fail() could not take the lock then)
            self._close_replies()
        if self.turn_waiters:
            with self.turn:
                self.turn.notify_all()
        if self.attended and not self.done:
            reactor().arm(self)

    # -- the reactor's side ---------------------------------------------
    def attend(self, future: ChannelFuture) -> None:
        """``future`` has a callback or a waiter: the reactor reads until it completes."""
        with self.lock:
            if future.attended or future.completed() or self.done:
                return
            future.attended = True
            self.attended += 1
        self.flush()
        reactor().arm(self)

    def fileno(self) -> int:
        return self.replies.sock.fileno()

    def on_readable(self) -> None:
        self.poll()

    def sweep(self) -> bool:
        """Drain unread replies, fail calls that cannot succeed; False once closed."""
        if self.done:
            return False
        if self._owner() is None:  # its client was dropped, so no call is in flight
            self.fail(ReferenceError)
            return False
        self.poll()
        self.check()
        return not self.done

    def check(self) -> None:
        """Fail the calls waiting for ``_SLICE`` s whose server moved or whose program stops."""
        old = time.monotonic() - _SLICE
        with self.lock:
            waiting = [(req_id, method) for req_id, (_, method, sent) in self.calls.items() if sent < old]
        if not waiting:
            return
        moved = self.client._moved(self.peer, waiting[0][1])
        if moved is not None:
            self.fail(lambda m: self.client._moved(self.peer, m) or moved)
            return
        for req_id, method in waiting:
            error = self.client._stopping(method)
            if error is None:
                return
            with self.lock:
                entry = self.calls.pop(req_id, None)
            if entry is not None:
                entry[0].set_exception(error)

    # -- ending ---------------------------------------------------------
    def lost(self, exc: BaseException) -> None:
        """The connection broke: fail every call in flight with ``exc`` as the cause."""
        self.fail(lambda method: self.client._lost(self.peer, method, exc))

    def _close_replies(self) -> None:
        """Close the replies if no other thread reads them; one that does closes them as it
        lets go of the read lock, since it looks at ``done`` after letting go (_release)."""
        if self.read_lock.acquire(blocking=False):  # nobody reads, or this thread does
            try:
                self.replies.close()
            finally:
                self.read_lock.release()

    def fail(self, error: Callable[[str], BaseException]) -> None:
        """Close the channel; every call still in flight fails with ``error(method)``."""
        with self.lock:
            self.done = True
            calls, self.calls = self.calls, {}
            self.attended = 0
            self.held = []
        # Closed only where no other thread is inside OpenSSL on it (Connection.shutdown):
        # a thread reading the replies closes them as it stops (_release).
        self.replies.shutdown()  # wakes a thread blocked reading it
        self.requests.shutdown()
        with self.send_lock:
            self.requests.close()
        self._close_replies()
        for future, method, _ in calls.values():
            future.set_exception(error(method))
        with self.turn:
            self.turn.notify_all()
