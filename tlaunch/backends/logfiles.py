"""Log files of this machine, followed as they grow: step by step (:class:`LogFollower`) or as lines.

The handles of runs whose logs are files here (:class:`~tlaunch.backends.recorded.RecordedRun`:
``local_mp``, ``slurm`` in an allocation; the launcher's own :class:`~tlaunch.run.Run`) read
them with this; each line comes back as a :class:`~tlaunch.backends.handle.LogLine` labelled
with its file's name (``server_0``).

A run's nodes write their logs to files (``<run>/logs/<node>.log``); following
them reads each file from where the last read stopped, in turns, and keeps
a line that has no newline yet until it has one (or the run has ended). New
files join as they appear (a node that starts later): listed again a second
after the last new one, then less and less often (up to every 8 s) while none
comes. :func:`follow_files` loops with a sleep between steps (``tlaunch logs
-f``); a job server steps a :class:`LogFollower` from its event loop, so a
quiet run's follower holds no thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from tlaunch.backends.handle import LogLine

__all__ = ["POLL", "LogFollower", "LogFollowing", "LogSteps", "follow_files", "stem"]

POLL = 0.2
"""Seconds between reads while following."""
_RELIST, _RELIST_MOST = 1.0, 8.0  # seconds between looks for new logs while following: first, at most


@runtime_checkable
class LogSteps(Protocol):
    """A run's logs followed one step at a time: each :meth:`read` gives what is new, and never waits.

    What a job server's event loop steps through (a wait of its own between steps), so
    a stream that follows a quiet run holds no thread.
    """

    def read(self, last: bool = False) -> list[LogLine]:
        """The lines since the last read; ``last``: the run has ended (asked before this read),
        so what is left comes too."""

    def relist_due(self) -> bool:
        """Whether the next :meth:`read` may wait (looking for new logs: a call to the run's
        coordinator); such a read belongs on a thread."""

    def close(self) -> None:
        """Let go of what it holds (connections, tails), without waiting for them; idempotent."""


@runtime_checkable
class LogFollowing(Protocol):
    """A run whose logs can be followed step by step (:class:`LogSteps`)."""

    def log_follower(self, node: str | None = None) -> LogSteps | None:
        """Its logs (node ``node``'s only) from their start, to step through; None: not now
        (follow :meth:`RunHandle.logs` instead). It may wait (connections): call it on a thread.

        Raises:
            KeyError: the run has no log of node ``node``.
        """


class LogFollower:
    """Log files followed one step at a time: :meth:`read` gives what is new and never waits.

    What :meth:`RecordedRun.logs` loops over with a sleep between steps, and what
    an event loop (the job server's) steps through with its own, non-blocking
    wait, so following a quiet run holds no thread.

    Args:
        files: path -> node key, the files to read.
        relist: gives the files again (following: new ones join), about once a second.
    """

    def __init__(self, files: dict[str, str], relist: Callable[[], dict[str, str]] | None = None) -> None:
        self._files = dict(files)
        self._offsets = dict.fromkeys(self._files, 0)
        self._pending = dict.fromkeys(self._files, b"")
        self._relist = relist
        self._listed = time.monotonic()
        self._every = _RELIST

    def relist_due(self) -> bool:
        """Whether the next :meth:`read` would list the files again (it may wait on a run's coordinator)."""
        return self._relist is not None and time.monotonic() - self._listed > self._every

    def read(self, last: bool = False) -> list[LogLine]:
        """The lines written since the last read; ``last``: the run has ended, so the lines not yet
        ended by a newline come too (ask whether it ended *before* the read)."""
        if self._relist is not None and (last or self.relist_due()):
            self._listed = time.monotonic()
            new = {p: k for p, k in self._relist().items() if p not in self._files}
            # A new log (a node that started): looked for again soon; none: less and less often.
            self._every = _RELIST if new else min(_RELIST_MOST, self._every * 2)
            for path, key in new.items():
                self._files[path], self._offsets[path], self._pending[path] = key, 0, b""
        out: list[LogLine] = []
        for path, key in self._files.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[path])
                    data = f.read()
            except FileNotFoundError:
                continue
            self._offsets[path] += len(data)
            *lines, self._pending[path] = (self._pending[path] + data).split(b"\n")
            out.extend(LogLine(key, raw.decode("utf-8", "replace"), label=stem(path)) for raw in lines)
        if last:
            for path, rest in self._pending.items():
                if rest:
                    out.append(LogLine(self._files[path], rest.decode("utf-8", "replace"), label=stem(path)))
                    self._pending[path] = b""
        return out

    def close(self) -> None:
        """Nothing is held between reads (each opens its files)."""


def follow_files(
    files: dict[str, str], done: Callable[[], bool], relist: Callable[[], dict[str, str]] | None = None
) -> Iterator[LogLine]:
    """The lines of ``files`` (path -> node), read in turns as they grow, until ``done()`` says so.

    ``relist`` (when following) gives the files again, about once a second: new ones join.
    """
    follower = LogFollower(files, relist)
    while True:
        last = done()  # asked before reading: what was written before the end is read after it
        yield from follower.read(last)
        if last:
            return
        time.sleep(POLL)


def stem(path: str) -> str:
    """A log file's name without ``.log``: how ``tlaunch logs`` labels its lines (``server_0``)."""
    return os.path.basename(path)[:-4]
