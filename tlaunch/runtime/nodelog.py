"""A node's log file, written so that the node's output never stops flowing.

A write that fails (a full disk, a removed directory) is dropped and said once
on stderr; the pump that copies the node's output keeps draining its pipe, so
the node never blocks on a full pipe and the run goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import IO, Protocol

__all__ = ["NodeLog", "wait_with_output"]

log = logging.getLogger(__name__)


class NodeLog:
    """Append-only log of one node; see the module docstring."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lost = 0  # bytes that could not be written
        self._file: IO[bytes] | None = None
        try:
            self._file = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        except OSError as exc:
            self._failed(exc, 0)

    def write(self, data: bytes) -> None:
        """Append ``data``; on failure, drop it (counted in ``lost``)."""
        if self._file is None:
            self.lost += len(data)
            return
        try:
            self._file.write(data)
        except OSError as exc:
            self._failed(exc, len(data))

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
