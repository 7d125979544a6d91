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

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KEEP_BYTES", "KEEP_DAYS", "Collected", "collect", "main"]

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


def _environments(root: str, marker: str, owner: int | None) -> list[tuple[float, int, str]]:
    """(last used, bytes, folder) of each finished environment under ``root`` (of ``owner`` only, if given),
    least recently used first."""
    found = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        path = os.path.join(root, name)
        made = os.path.join(path, marker)
        try:
            if owner is not None and os.lstat(path).st_uid != owner:
                continue
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
    owner: int | None = None,
) -> Collected:
    """Remove the environments under ``root`` that nobody uses (see the module docstring).

    Args:
        marker: the file a finished environment holds (:data:`tlaunch.runtime.pyenv.MARKER`): its
            time is the environment's last use, its ``bytes`` the environment's size.
        owner: only environments whose folder this uid owns count (a job server's sealed store: root's
            only, never a folder a user's build is still making).
    """
    now = time.time() if now is None else now
    envs = _environments(root, marker, owner)
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
        # new one could both build. A built environment is read-only: its folders writable again first
        # (not as root: root removes what it likes, and must change no mode through a link).
        if os.geteuid() != 0:
            _writable(path)
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.exists(path)
    finally:
        os.close(fd)


def _writable(path: str) -> None:
    """Give the folders under ``path`` their owner's write bit (so that its owner can remove them)."""
    for top, dirs, _ in os.walk(path):
        for name in (top, *(os.path.join(top, d) for d in dirs)):
            with contextlib.suppress(OSError):
                if not os.path.islink(name):
                    os.chmod(name, 0o700)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tlaunch.runtime.envgc ROOT MARKER --keep-bytes N --keep-days D``: :func:`collect`, what it
    removed printed as JSON (how a job server as root collects a folder a user owns: as that user)."""
    p = argparse.ArgumentParser(prog="python -m tlaunch.runtime.envgc", description=__doc__.split("\n")[0])
    p.add_argument("root")
    p.add_argument("marker")
    p.add_argument("--keep-bytes", type=int, default=KEEP_BYTES)
    p.add_argument("--keep-days", type=float, default=KEEP_DAYS)
    args = p.parse_args(argv)
    done = collect(args.root, args.marker, args.keep_bytes, args.keep_days)
    print(json.dumps({"removed": list(done.removed), "kept_bytes": done.kept_bytes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
