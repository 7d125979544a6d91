"""Waiting for a socket to become readable, whatever its descriptor's number.

``select(2)`` refuses descriptors past 1024 (``FD_SETSIZE``); a launcher or a
head of a few hundred hosts holds more than that, so every wait of the RPC
layer uses ``poll(2)``.
"""

from __future__ import annotations

import select
from collections.abc import Sequence
from typing import Protocol

__all__ = ["Readiness", "wait_readable"]

_READY = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR | select.POLLNVAL


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


def wait_readable(socks: Sequence[_HasFileno], timeout: float | None) -> bool:
    """Whether any of ``socks`` has something to read (or was closed), waiting up to ``timeout`` s.

    A closed peer, an error or a descriptor closed meanwhile count as readable:
    the read that follows says what happened.

    Raises:
        ValueError: a socket was closed before the wait (its ``fileno()`` is -1).
    """
    poller = select.poll()
    for sock in socks:
        poller.register(sock.fileno(), _READY)
    return bool(poller.poll(_ms(timeout)))


def _ms(timeout: float | None) -> int | None:
    return None if timeout is None else max(0, int(timeout * 1000 + 0.999))  # never shorter than asked


class Readiness:
    """One socket's waits, its poll object made once (a connection's reads wait often: a third
    of the cost of a fresh one each time, and less than ``select(2)``)."""

    __slots__ = ("_fd", "_poller")

    def __init__(self) -> None:
        self._fd = -1
        self._poller: select.poll | None = None

    def wait(self, sock: _HasFileno, timeout: float | None) -> bool:
        """Whether ``sock`` has something to read (or was closed), waiting up to ``timeout`` s.

        Raises:
            ValueError: the socket was closed before the wait (its ``fileno()`` is -1).
        """
        fd = sock.fileno()
        if fd < 0:
            raise ValueError("the socket is closed")
        if fd != self._fd or self._poller is None:
            self._poller = select.poll()
            self._poller.register(fd, _READY)
            self._fd = fd
        return bool(self._poller.poll(_ms(timeout)))
