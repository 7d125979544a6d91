"""The process's reactor and fallback pool for futures of RPC calls.

The reactor is one epoll thread. It reads a futures channel (see
:mod:`tlaunch.rpc.channel`) when the channel arms it, one reading at a time,
and sweeps every channel it tracks twice a second. While channels hold back
the requests of bursts, it also ticks every :data:`HOLD_TICK` s and sends
those held for a whole tick (nobody waited for them). Calls that cannot start
on a channel (their server's address is not known yet) run in a small thread
pool.

A kernel timer per burst would bound the wait more tightly, but arming one
(``timerfd_settime``) costs ~13 us on the test VM, more than the write it saves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

__all__ = ["HOLD_TICK", "Reactor", "Watched", "reactor", "submit"]

log = logging.getLogger(__name__)
_SWEEP = 0.5  # seconds between liveness checks of calls in flight
HOLD_TICK = 0.005  # seconds between the reactor's sends of requests held back, while any are
_IDLE_TICKS = 20  # ticks without a request held back, after which the reactor stops ticking


_ONESHOT = select.EPOLLIN | select.EPOLLONESHOT


class Watched(Protocol):
    """A connection whose replies the reactor reads (a futures channel)."""

    def fileno(self) -> int:
        """The descriptor to wait on."""

    def on_readable(self) -> None:
        """Read what has arrived and complete its futures (re-arming if it still needs to)."""

    def sweep(self) -> bool:
        """Drain and check the calls in flight; False once the channel is closed."""

    def held_since(self) -> float | None:
        """When the oldest request held back was held (``time.monotonic()``); None if none is."""

    def flush(self, waited: bool = True) -> None:
        """Send the requests held back (``waited=False``: nobody waited for them)."""


class Reactor:
    """One epoll thread completing every future of this process."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watched: dict[int, Watched] = {}
        self._lock = threading.Lock()
        self._holding: set[Watched] = set()  # items that held requests back since the last tick
        self._ticking = False
        self._idle = 0  # ticks since an item last held requests back
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._epoll.register(self._wake, select.EPOLLIN)
        self._thread = threading.Thread(target=self._loop, name="tlaunch-reactor", daemon=True)
        self._thread.start()

    def track(self, item: Watched) -> None:
        """Sweep ``item`` twice a second until it says it is closed."""
        with self._lock:
            self._watched[item.fileno()] = item

    def arm(self, item: Watched) -> None:
        """Call ``item.on_readable()`` once, when it next has something to read."""
        fd = item.fileno()
        if fd < 0:  # closed meanwhile (its channel failed): nothing to wait for
            return
        try:
            self._epoll.modify(fd, _ONESHOT)
        except FileNotFoundError:
            try:
                self._epoll.register(fd, _ONESHOT)
            except FileExistsError:  # armed by another thread meanwhile
                self._epoll.modify(fd, _ONESHOT)

    def hold(self, item: Watched) -> None:
        """``item`` holds requests back: flush those still held a whole tick from now."""
        with self._lock:
            self._holding.add(item)
            if self._ticking:
                return
            self._ticking = True
        os.eventfd_write(self._wake, 1)

    def _tick(self, now: float) -> None:
        with self._lock:
            items, self._holding = self._holding, set()
            self._idle = 0 if items else self._idle + 1
            self._ticking = self._idle < _IDLE_TICKS
        for item in items:
            since = item.held_since()
            if since is None:
                continue
            if now - since < HOLD_TICK:  # held within the last tick: look again at the next
                with self._lock:
                    self._holding.add(item)
                continue
            try:
                item.flush(waited=False)
            except Exception:  # the reactor serves every channel: it must not die
                log.exception("sending the requests of a futures channel failed")

    def _loop(self) -> None:
        swept = ticked = time.monotonic()
        while True:
            for fd, _ in self._epoll.poll(HOLD_TICK if self._ticking else _SWEEP):
                if fd == self._wake:  # ticking starts; the first tick is a whole tick away
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake)
                    ticked = time.monotonic()
                    continue
                item = self._watched.get(fd)
                if item is not None:
                    try:
                        item.on_readable()
                    except Exception:  # the reactor serves every channel: it must not die
                        log.exception("reading a futures channel failed")
            now = time.monotonic()
            if self._ticking and now - ticked >= HOLD_TICK:
                ticked = now
                self._tick(now)
            if now - swept < _SWEEP:
                continue
            swept = now
            with self._lock:
                items = list(self._watched.items())
            for fd, item in items:
                try:
                    alive = item.sweep()
                except Exception:
                    log.exception("sweeping a futures channel failed")
                    alive = False
                if not alive:
                    self._forget(fd, item)

    def close_copies(self) -> None:
        """Close this reactor's descriptors in a forked child (where its thread does not run)."""
        self._epoll.close()
        with contextlib.suppress(OSError):
            os.close(self._wake)

    def _forget(self, fd: int, item: Watched) -> None:
        with self._lock:
            if self._watched.get(fd) is not item:
                return  # the descriptor's number now belongs to another channel
            del self._watched[fd]
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


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: it starts its own reactor and pool.

    The parent's reactor's descriptors are closed here, while their numbers are still
    the child's copies (:func:`tlaunch.rpc.shm._after_fork_in_child` says why).
    """
    global _reactor, _executor, _lock
    if _reactor is not None:
        _reactor.close_copies()
    _reactor = _executor = None
    _lock = threading.Lock()  # a thread of the parent may have held it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def submit(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``fn(*args)`` in the fallback pool (made on first use)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(64, thread_name_prefix="tlaunch-futures")
        pool = _executor
    return pool.submit(fn, *args)
