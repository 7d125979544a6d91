"""Following a run's log files on this machine: their lines, in turns, as they grow (:func:`follow_files`).

The handles of runs whose logs are files here (:class:`~tlaunch.backends.recorded.RecordedRun`:
``local_mp``, ``slurm`` in an allocation; the launcher's own :class:`~tlaunch.run.Run`) read
them with this; each line comes back as a :class:`~tlaunch.backends.handle.LogLine` labelled
with its file's name (``server_0``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from tlaunch.backends.handle import LogLine

__all__ = ["POLL", "follow_files", "stem"]

POLL = 0.2
"""Seconds between reads of the files while following."""
_RELIST = 1.0  # seconds between looks for new logs while following


def follow_files(
    files: dict[str, str], done: Any, relist: Callable[[], dict[str, str]] | None = None
) -> Iterator[LogLine]:
    """The lines of ``files`` (path -> node), read in turns as they grow, until ``done()`` says so.

    ``relist`` (when following) gives the files again, about once a second: new ones join.
    """
    files = dict(files)
    offsets = dict.fromkeys(files, 0)
    pending = dict.fromkeys(files, b"")
    listed = time.monotonic()
    while True:
        last = done()  # asked before reading: what was written before the end is read after it
        if relist is not None and (last or time.monotonic() - listed > _RELIST):
            listed = time.monotonic()
            for path, key in relist().items():
                if path not in files:
                    files[path], offsets[path], pending[path] = key, 0, b""
        for path, key in files.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offsets[path])
                    data = f.read()
            except FileNotFoundError:
                continue
            offsets[path] += len(data)
            *lines, pending[path] = (pending[path] + data).split(b"\n")
            for raw in lines:
                yield LogLine(key, raw.decode("utf-8", "replace"), label=stem(path))
        if last:
            for path, rest in pending.items():
                if rest:
                    yield LogLine(files[path], rest.decode("utf-8", "replace"), label=stem(path))
            return
        time.sleep(POLL)


def stem(path: str) -> str:
    """A log file's name without ``.log``: how ``tlaunch logs`` labels its lines (``server_0``)."""
    return os.path.basename(path)[:-4]
