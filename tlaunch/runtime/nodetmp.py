"""A node process's own ``$TMPDIR``: made as it starts, removed as it ends, swept if its maker was killed.

A folder ``tlaunch-<run>-tmp-<random>`` (mode 0700) in the ``$TMPDIR`` the node
would have had. Its maker (the node's supervisor, or the launcher's thread for
a local node) holds a ``flock`` on it while the node runs, and removes it as
the node's process ends. A maker killed with SIGKILL lets the lock go with it:
the next :func:`sweep` of that folder (at every supervisor's end, at every
local run's stop) removes what it left. A folder whose lock is held is in use,
whoever holds it: another pid namespace, another host on a shared file system.
A folder is made under a hidden name and renamed once locked; a hidden one
that is a minute old lost its maker before that, and is swept too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import threading
import time

__all__ = ["NodeTmp", "sweep"]

log = logging.getLogger("tlaunch")

_PREFIX = "tlaunch-"
_INFIX = "-tmp-"


class NodeTmp:
    """One node process's ``$TMPDIR`` (:attr:`path`), locked by this process until :meth:`remove`."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._lock = threading.Lock()  # a node's thread and a stop may remove it at once

    @classmethod
    def make(cls, parent: str, run_id: str) -> NodeTmp | None:
        """A new folder in ``parent`` for run ``run_id``'s node; None where none can be made there
        (the node then has the ``$TMPDIR`` it would have had)."""
        name = _PREFIX + run_id.replace(os.sep, "_") + _INFIX + os.urandom(4).hex()
        aside = os.path.join(parent, "." + name)  # not swept until it is locked and renamed
        try:
            os.mkdir(aside, 0o700)
        except OSError as exc:
            log.warning("no temporary folder of a node's own in %s: %s", parent, exc)
            return None
        try:
            fd = os.open(aside, os.O_RDONLY | os.O_DIRECTORY)  # not inherited by the node
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path = os.path.join(parent, name)
                os.rename(aside, path)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            with contextlib.suppress(OSError):
                os.rmdir(aside)
            raise
        return cls(path, fd)

    def remove(self) -> None:
        """Remove the folder and what is in it, then let its lock go (once, whoever calls)."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd < 0:
            return
        import shutil  # here: its import (with bz2's and lzma's) is a node's start's cost

        shutil.rmtree(self.path, ignore_errors=True)
        os.close(fd)  # after: no sweep takes it while it is being removed


def sweep(parent: str) -> None:
    """Remove the node folders in ``parent`` that no live maker holds (their makers were killed)."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    uid, now = os.getuid(), time.time()
    for entry in entries:
        aside = entry.name.startswith("." + _PREFIX)  # a maker killed before it locked its folder
        if not ((aside or entry.name.startswith(_PREFIX)) and _INFIX in entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or (aside and now - st.st_mtime < 60):
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: its node runs
        except OSError:
            os.close(fd)
            continue
        try:
            import shutil

            shutil.rmtree(entry.path, ignore_errors=True)  # under the lock: one sweeper removes it
        finally:
            os.close(fd)
