"""Removing runtime environments nobody uses: the oldest first, past an age or a total size.

Each environment under a root (``<TLAUNCH_HOME>/envs`` on this machine,
``~/.tlaunch/envs`` on an SSH host) says when it was last used (its marker's
time, touched each time a job finds it: :func:`tlaunch.runtime.pyenv.find`)
and how large it is (written in its marker when it was built). :func:`collect`
removes those unused for more than ``keep_days``, then, while the rest hold
more than ``keep_bytes``, the least recently used. An environment a job holds
(:func:`tlaunch.runtime.pyenv.hold`: a shared lock, taken by a job's launcher
on this machine for as long as its run lasts) or is building (the build's
exclusive lock) is never removed, nor one used in the last hour (a job on an
SSH host that just found it holds no lock here), nor a half-made one whose
builder may still be at work (the next build removes those).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from dataclasses import dataclass

__all__ = ["KEEP_BYTES", "KEEP_DAYS", "Collected", "collect"]

KEEP_DAYS = 30.0
"""Days an environment is kept after its last use (``--env-keep-days``)."""
KEEP_BYTES = 50 << 30
"""Bytes of environments kept under a root (``--env-keep-gb``)."""
_RECENT = 3600.0  # seconds: an environment used this recently stays, whatever the size


@dataclass(frozen=True)
class Collected:
    """What :func:`collect` did.

    Attributes:
        removed: the folders removed.
        kept_bytes: the bytes of the environments left.
    """

    removed: tuple[str, ...]
    kept_bytes: int


def _environments(root: str, marker: str) -> list[tuple[float, int, str]]:
    """(last used, bytes, folder) of each finished environment under ``root``, least recently used first."""
    found = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        path = os.path.join(root, name)
        made = os.path.join(path, marker)
        try:
            used = os.stat(made).st_mtime
            with open(made) as f:
                size = int(json.load(f).get("bytes") or 0)
        except (OSError, ValueError, AttributeError):
            continue
        found.append((used, size, path))
    return sorted(found)


def collect(
    root: str,
    marker: str,
    keep_bytes: int = KEEP_BYTES,
    keep_days: float = KEEP_DAYS,
    now: float | None = None,
) -> Collected:
    """Remove the environments under ``root`` that nobody uses (see the module docstring).

    Args:
        marker: the file a finished environment holds (:data:`tlaunch.runtime.pyenv.MARKER`): its
            time is the environment's last use, its ``bytes`` the environment's size.
    """
    now = time.time() if now is None else now
    envs = _environments(root, marker)
    total = sum(size for _, size, _ in envs)
    removed = []
    for used, size, path in envs:
        old = now - used > keep_days * 86400
        if not old and (total <= keep_bytes or now - used < _RECENT):
            continue
        if _remove_unless_held(path):
            removed.append(path)
            total -= size
    return Collected(tuple(removed), total)


def _remove_unless_held(path: str) -> bool:
    """Remove the environment at ``path`` if no job holds it and none builds it; whether it was."""
    try:
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held (a job runs in it) or being built
            return False
        # Its lock file stays (a few bytes): removed, a builder waiting on it and one opening a
        # new one could both build. A built environment is read-only: its folders writable again first.
        for top, dirs, _ in os.walk(path):
            for name in (top, *(os.path.join(top, d) for d in dirs)):
                with contextlib.suppress(OSError):
                    if not os.path.islink(name):
                        os.chmod(name, 0o700)
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.exists(path)
    finally:
        os.close(fd)
