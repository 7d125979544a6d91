"""An event that a ``poll(2)`` can wait on beside a channel: a command's wait wakes when it is set.

A connection's commands wait for their channel with :func:`wait_channel`; with
:class:`Interrupt` in the same wait they need not wake every fraction of a
second to look at a flag (a Ctrl-C, see :func:`tlaunch.ssh.fanout.pmap`): at 256
hosts, 32 commands waking five times a second cost the launcher ~5 ms of CPU a
second, for nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import paramiko

from tlaunch.rpc.readiness import wait_readable

__all__ = ["FED_END", "PIECE", "WAIT_SLICE", "Interrupt", "end_fed", "feed", "wait_channel", "wait_ended"]

WAIT_SLICE = 5.0
"""The longest a command's wait sleeps without looking at its deadline (its channel and
its connection's :class:`Interrupt` wake it at once)."""

PIECE = 1 << 20
"""A command's stdin is sent in pieces of this many bytes, the interrupt looked at before each
(:func:`feed`): files shipped can be cut short."""

FED_END = 5.0
"""How long a command fed on stdin (files to unpack) that was cut short may take to end
(:func:`end_fed`) before its channel is closed regardless."""


class Interrupt:
    """:class:`threading.Event`'s ``set``/``clear``/``is_set``, and a descriptor that is
    readable while it is set (made on the first :meth:`fileno`: an ``eventfd``, where there is
    one, else a pipe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._fds: tuple[int, int] | None = None  # (read, write); the same eventfd twice

    def set(self) -> None:
        """Set it: every wait on :meth:`fileno` returns."""
        with self._lock:
            if not self._set:
                self._set = True
                if self._fds is not None and self._fds[0] >= 0:
                    os.write(self._fds[1], (1).to_bytes(8, "little"))

    def clear(self) -> None:
        """Clear it: :meth:`fileno` is no longer readable."""
        with self._lock:
            if self._set:
                self._set = False
                if self._fds is not None and self._fds[0] >= 0:
                    os.read(self._fds[0], 8)

    def is_set(self) -> bool:
        """Whether it is set."""
        return self._set

    def fileno(self) -> int:
        """A descriptor readable while it is set (closed by :meth:`close`).

        Raises:
            ValueError: it was closed.
        """
        with self._lock:
            if self._fds is None:
                if hasattr(os, "eventfd"):
                    fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
                    self._fds = (fd, fd)
                else:  # pragma: no cover - no eventfd outside Linux
                    r, w = os.pipe()
                    os.set_blocking(r, False)
                    self._fds = (r, w)
                if self._set:
                    os.write(self._fds[1], (1).to_bytes(8, "little"))
            elif self._fds[0] < 0:
                raise ValueError("the interrupt was closed")
            return self._fds[0]

    def close(self) -> None:
        """Close its descriptor, if it made one (idempotent)."""
        with self._lock:
            fds, self._fds = self._fds, (-1, -1)
        if fds is not None and fds[0] >= 0:
            for fd in dict.fromkeys(fds):
                os.close(fd)


def wait_channel(chan: Any, interrupt: Interrupt | None, deadline: float | None) -> str | None:
    """Wait until ``chan`` (a paramiko channel) has something to read or has ended, ``interrupt``
    is set or ``deadline`` (monotonic) passes, whichever comes first: with ``poll(2)`` (a launcher
    holds over 1024 descriptors), and nothing wakes it to look in between.

    Returns:
        None, or why to give up: ``"interrupted"`` or ``"timeout"``.
    """
    left = WAIT_SLICE if deadline is None else deadline - time.monotonic()
    wait_readable([chan] if interrupt is None else [chan, interrupt], min(WAIT_SLICE, left))
    if interrupt is not None and interrupt.is_set():
        return "interrupted"
    if deadline is not None and time.monotonic() > deadline:
        return "timeout"
    return None


def feed(chan: Any, data: bytes | memoryview, interrupt: Interrupt | None, lead: bytes = b"") -> bool:
    """Send ``data`` on ``chan`` in pieces of :data:`PIECE` bytes, each after a look at ``interrupt``.

    ``lead`` (a command's header) goes in the same write as the first piece: one packet where
    both fit in one, where two writes are two (~0.3 ms of paramiko's CPU each, on the launcher).

    Returns:
        False if ``interrupt`` was set before all of it went (the rest is not sent).
    """
    view = memoryview(data)
    for start in range(0, max(len(view), 1 if lead else 0), PIECE):
        if interrupt is not None and interrupt.is_set():
            return False
        chan.sendall(lead + view[start : start + PIECE] if start == 0 else bytes(view[start : start + PIECE]))
    return True


def end_fed(chan: Any, seconds: float = FED_END) -> None:
    """End a command fed on stdin that was cut short, and wait for it to end (``seconds`` at most).

    Its input ends (an EOF: what it has not read yet never comes), then its channel is read
    until the host says it ended, and closed. A command that writes what it is fed (``tar -x``
    of the files shipped) goes on with what it already got when its channel is merely closed:
    the cleanup that follows a Ctrl-C would race it, and files it unpacks after that cleanup
    would outlive the run.
    """
    until = time.monotonic() + seconds
    with contextlib.suppress(paramiko.SSHException, OSError, EOFError):  # the link broke: nothing to wait for
        chan.shutdown_write()
    wait_ended(chan, until)
    chan.close()


def wait_ended(chan: Any, until: float) -> None:
    """Read ``chan`` (its output dropped) until the host says its command ended, or ``until``
    (monotonic) passes; a broken link ends the wait."""
    with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
        while not (chan.closed or chan.eof_received) and time.monotonic() < until:
            if chan.recv_ready():
                chan.recv(1 << 16)
            elif chan.recv_stderr_ready():
                chan.recv_stderr(1 << 16)
            else:
                wait_channel(chan, None, until)
