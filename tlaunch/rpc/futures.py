"""Futures of RPC calls: sent from the caller's thread, completed by one reactor.

``client.futures.method(...)`` writes the request on a connection of its own in
the calling thread and returns at once; a single epoll thread per process waits
on every connection with a reply due, reads replies as they come (several per
wake-up under load) and completes their futures. Calls that cannot start that
way (their server's address is not known yet) run in a small thread pool.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from tlaunch.rpc.framing import Connection

__all__ = ["InFlight", "Reactor", "reactor", "submit"]

_SWEEP = 0.5  # seconds between liveness checks of calls in flight
_EVENTS = select.EPOLLIN | select.EPOLLONESHOT


class InFlight(Protocol):
    """A call waiting for its reply (implemented by the client)."""

    conn: Connection
    future: Future[Any]
    started: float

    def complete(self) -> None:
        """Read the reply from ``conn`` and complete ``future`` (never raises)."""

    def check(self) -> BaseException | None:
        """An error if the call can no longer succeed (server gone, program stopping)."""

    def abandon(self, exc: BaseException) -> None:
        """Fail ``future`` with ``exc`` and drop the connection."""


class Reactor:
    """One epoll thread completing every future of this process."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._calls: dict[int, InFlight] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="tlaunch-reactor", daemon=True)
        self._thread.start()

    def watch(self, call: InFlight) -> None:
        """Complete ``call`` once its reply arrives."""
        fd = call.conn.sock.fileno()
        with self._lock:
            self._calls[fd] = call
        # One-shot: after it fires, the fd stays registered but disarmed, so the
        # next call on the same connection re-arms it with one system call.
        try:
            self._epoll.modify(fd, _EVENTS)
        except FileNotFoundError:
            self._epoll.register(fd, _EVENTS)

    def _finish(self, fd: int) -> None:
        with self._lock:
            call = self._calls.pop(fd, None)
        if call is not None:
            call.complete()

    def _loop(self) -> None:
        while True:
            for fd, _ in self._epoll.poll(_SWEEP):
                self._finish(fd)
            self._sweep()

    def _sweep(self) -> None:
        old = time.monotonic() - _SWEEP
        with self._lock:
            calls = [(fd, c) for fd, c in self._calls.items() if c.started < old]
        for fd, call in calls:
            exc = call.check()
            if exc is None:
                continue
            with self._lock:
                if self._calls.pop(fd, None) is None:
                    continue
            self._unregister(fd)
            call.abandon(exc)

    def _unregister(self, fd: int) -> None:
        with contextlib.suppress(FileNotFoundError, ValueError, OSError):
            self._epoll.unregister(fd)


_reactor: Reactor | None = None
_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def reactor() -> Reactor:
    """This process's reactor (started on first use)."""
    global _reactor
    with _lock:
        if _reactor is None:
            _reactor = Reactor()
        return _reactor


def submit(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``fn(*args)`` in the fallback pool (made on first use)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(64, thread_name_prefix="tlaunch-futures")
        pool = _executor
    return pool.submit(fn, *args)
