"""A node's log file, written so that the node's output never stops flowing.

A write that fails (a full disk, a removed directory) is dropped and said once
on stderr; the pump that copies the node's output keeps draining its pipe, so
the node never blocks on a full pipe and the run goes on.

The log also keeps the last :data:`TAIL_BYTES` of what its node wrote since
its process started (:meth:`NodeLog.mark`) in memory: when the process exits
non-zero, its last lines (:meth:`NodeLog.tail`) go into its failure report,
so a command that printed ``ValueError: ...`` before exiting 1 says so where
the root cause is shown, not only in its log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import IO, Protocol

__all__ = ["TAIL_BYTES", "TAIL_LINES", "NodeLog", "last_lines", "wait_with_output"]

TAIL_BYTES = 4096
"""At most this much of a failed node's last output goes into its failure report..."""
TAIL_LINES = 20
"""...and at most this many lines."""

log = logging.getLogger(__name__)


class NodeLog:
    """Append-only log of one node; see the module docstring."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lost = 0  # bytes that could not be written
        self._tail = bytearray()  # the last TAIL_BYTES written since mark()
        self._file: IO[bytes] | None = None
        try:
            self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        except OSError as exc:
            self._failed(exc, 0)

    def write(self, data: bytes) -> None:
        """Append ``data``; on failure, drop it (counted in ``lost``)."""
        self._tail += data[-TAIL_BYTES:]
        if len(self._tail) > TAIL_BYTES:
            del self._tail[:-TAIL_BYTES]
        if self._file is None:
            self.lost += len(data)
            return
        try:
            self._file.write(data)
        except OSError as exc:
            self._failed(exc, len(data))

    def mark(self) -> None:
        """A new process of the node starts: :meth:`tail` forgets what the last one wrote."""
        self._tail.clear()

    def tail(self) -> str:
        """The last lines written since :meth:`mark` (at most :data:`TAIL_LINES`, :data:`TAIL_BYTES`)."""
        return last_lines(bytes(self._tail))

    def _failed(self, exc: OSError, size: int) -> None:
        if not self.lost:
            log.warning("cannot write the log %s (%s); its output goes on, unlogged", self.path, exc)
        self.lost += size or 1

    def close(self) -> None:
        """Close the file; idempotent."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def __enter__(self) -> NodeLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def last_lines(data: bytes) -> str:
    """The last :data:`TAIL_LINES` whole lines of ``data`` (its first line dropped when cut mid-line)."""
    if len(data) >= TAIL_BYTES and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]  # it began mid-line
    lines = data.decode("utf-8", "replace").rstrip().splitlines()
    return "\n".join(lines[-TAIL_LINES:])


class _Process(Protocol):
    @property
    def pid(self) -> int: ...

    def wait(self, timeout: float | None = None) -> int: ...


def wait_with_output(proc: _Process, pump: Callable[[], None], drain: float = 1.0) -> int:
    """Wait for a node's process while ``pump`` copies its output; returns its exit code.

    The pump runs in a thread of its own: a child of the node that left its
    process group may hold the output pipe open long after the node ended, and
    the end must still be reported at once. What is already in the pipe gets
    ``drain`` seconds; the node's whole group is killed first (nothing of it
    outlives it).
    """
    thread = threading.Thread(target=pump, name="tlaunch-output", daemon=True)
    thread.start()
    code = proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    thread.join(drain)
    return code
