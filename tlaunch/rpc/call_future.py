"""The future of a call on a futures channel (:mod:`tlaunch.rpc.channel`).

A :class:`~concurrent.futures.Future` makes a condition variable (~1.5 us on the
test VM, a tenth of a call) that only callbacks, ``wait``/``as_completed`` and
blocking waits use; a future whose owner calls ``result()`` (it reads the reply
itself) never needs it. So a :class:`ChannelFuture` makes its condition and
waiters list on first use, and a reply completes a future that has neither
without a lock of its own (:meth:`ChannelFuture._finish`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, RUNNING
from typing import Any, Protocol

__all__ = ["ChannelFuture", "ChannelOwner", "Reads"]


class Reads(Protocol):
    """What a future asks of its channel (:class:`~tlaunch.rpc.channel.Channel`)."""

    def collect(self, future: ChannelFuture, timeout: float | None) -> None:
        """Read replies until ``future`` is done or ``timeout`` s pass."""

    def poll(self, waited: bool = False) -> None:
        """Read the replies already arrived."""

    def attend(self, future: ChannelFuture) -> None:
        """``future`` has a callback or a waiter: read for it until it completes."""


class _Waiters(list):  # type: ignore[type-arg]
    """``Future._waiters``: an entry means ``wait``/``as_completed`` waits without reading."""

    __slots__ = ("_future",)

    def __init__(self, future: ChannelFuture) -> None:
        self._future = future

    def append(self, waiter: Any) -> None:
        super().append(waiter)
        self._future._attend()


_LAZY = threading.Lock()  # makes a future's condition and waiters list, or completes it without them


class ChannelFuture(Future[Any]):
    """A future completed by whichever thread reads its channel."""

    def __init__(self, channel: Reads, owner: ChannelOwner) -> None:
        # Future.__init__'s attributes, the condition and waiters list made on first use.
        self._state = RUNNING  # what set_running_or_notify_cancel() does to a fresh future
        self._result = None
        self._exception: BaseException | None = None
        self._done_callbacks: list[Callable[[Future[Any]], object]] = []
        self._cond: threading.Condition | None = None
        self._waiting: _Waiters | None = None
        self._channel = channel
        self.owner = owner  # a call in flight keeps its client alive (the channel holds it weakly)
        self.attended = False  # counted in the channel's ``attended``

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        cond = self._cond
        if cond is None:
            with _LAZY:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition()
        return cond

    @property
    def _waiters(self) -> _Waiters:  # type: ignore[override]
        waiting = self._waiting
        if waiting is None:
            with _LAZY:
                waiting = self._waiting
                if waiting is None:
                    waiting = self._waiting = _Waiters(self)
        return waiting

    def _finish(self, result: Any) -> None:
        """Complete with ``result``: at once if nobody made the condition (no callback,
        no waiter, no blocking wait can exist), else as ``set_result`` does."""
        with _LAZY:
            if self._cond is None:
                self._result = result
                self._state = FINISHED
                return
        self.set_result(result)

    def completed(self) -> bool:
        """Whether the call has completed (no reading, no lock: one attribute read)."""
        return self._state == FINISHED

    def result(self, timeout: float | None = None) -> Any:
        """The call's result; the calling thread reads the channel while it waits."""
        if self._state != FINISHED:
            self._channel.collect(self, timeout)
        if self._state == FINISHED and self._exception is None:
            return self._result  # done and fine: no lock to take
        return super().result(timeout=0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The call's exception (None if it succeeded); reads the channel while it waits."""
        if self._state != FINISHED:
            self._channel.collect(self, timeout)
        return super().exception(timeout=0)

    def done(self) -> bool:
        """Whether the call has completed (reads replies already arrived, without waiting)."""
        if self._state != FINISHED:
            self._channel.poll(waited=True)
        return self._state == FINISHED  # never cancelled: it runs from the start

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        """Call ``fn(future)`` once done; the reactor reads the channel until then."""
        super().add_done_callback(fn)
        self._attend()

    def _attend(self) -> None:
        if self._state != FINISHED:
            self._channel.attend(self)


class ChannelOwner(Protocol):
    """What a channel asks of the client that opened it (:class:`~tlaunch.rpc.client.RPCClient`)."""

    def _result(self, kind: int, buffers: list[memoryview]) -> Any:
        """The value of a reply, or its remote error raised."""

    def _stopping(self, method: str) -> Exception | None:
        """The error for a call waiting while the program stops, else None."""

    def _lost(self, peer: str, method: str, exc: BaseException) -> Exception:
        """The error for a call whose connection to ``peer`` was lost."""

    def _moved(self, peer: str, method: str) -> Exception | None:
        """The error for a call in flight if its server now lives elsewhere, else None."""
