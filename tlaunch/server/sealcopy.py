"""Root's copy of a folder a user built: new files of root's, read-only, nothing followed out of it.

:func:`copy_sealed` is how a job server under ``--unix-users`` takes a runtime
environment a user's launcher built (:mod:`tlaunch.server.envstore`). It runs as
root over a folder the user owns, so it trusts nothing in it:

- it walks by descriptors (``openat`` on each name, ``O_NOFOLLOW``): a folder
  swapped for a link on the way is refused, never followed;
- each file is opened ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file
  (a FIFO, a socket, a device is refused), then copied into a **new** file
  (``O_EXCL``): a descriptor a job kept open on the user's file writes into
  that file, never into root's copy;
- modes are root's: folders 0555, files 0444 (0555 if the user's was
  executable); never a set-id bit, never the user's owner;
- every file, folder and link must be the user's (``owner``): a hard link
  to a file of root's or another user's, which the user could not read, is
  refused, not read for them (where ``fs.protected_hardlinks`` is off);
- a link is copied as a link only if it stays inside the folder (relative,
  no ``..``) or names the server's own interpreter (a virtualenv's
  ``bin/python``); any other is refused;
- the bytes and the entries copied are bounded (the server's ``--env-keep-gb``).
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass

__all__ = ["Refused", "copy_sealed", "interpreters"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_MAX_DEPTH = 64
_MAX_ENTRIES = 1_000_000


class Refused(Exception):
    """What was built cannot be taken (the message says what, and where)."""


def interpreters() -> frozenset[str]:
    """The paths a virtualenv's ``bin/python`` may link to: this server's interpreter, as venv names it."""
    named = {sys.executable, getattr(sys, "_base_executable", sys.executable)}
    return frozenset(named | {os.path.realpath(p) for p in named})


@dataclass
class _Budget:
    max_bytes: int
    links: frozenset[str]
    owner: int | None
    bytes: int = 0
    entries: int = 0

    def entry(self, where: str, st: os.stat_result) -> None:
        self.entries += 1
        if self.entries > _MAX_ENTRIES:
            raise Refused(f"it holds more than {_MAX_ENTRIES} files and folders (at {where})")
        if self.owner is not None and st.st_uid != self.owner:
            raise Refused(f"{where} is not the user's (its owner is uid {st.st_uid})")

    def take(self, n: int, where: str) -> None:
        self.bytes += n
        if self.bytes > self.max_bytes:
            raise Refused(f"it is larger than {self.max_bytes} bytes (at {where}): the server keeps no more")


def copy_sealed(
    source: str, target: str, *, max_bytes: int, owner: int | None, links: frozenset[str] | None = None
) -> int:
    """Copy the folder ``source`` to ``target`` (made here, 0555 once full) as the module docstring says;
    the bytes copied.

    Args:
        owner: the uid whose every entry must be (None: anyone's).
        links: the absolute paths a link may name (default: :func:`interpreters`).

    Raises:
        Refused: ``source`` holds what cannot be taken (a link out of it, a FIFO, too much...);
            ``target`` is left for the caller to remove.
    """
    budget = _Budget(max_bytes, interpreters() if links is None else links, owner)
    src = os.open(source, _DIR)
    try:
        os.mkdir(target, 0o700)
        dst = os.open(target, _DIR)
        try:
            _copy_dir(src, dst, "", budget, 0)
            os.fchmod(dst, 0o555)
        finally:
            os.close(dst)
    except OSError as exc:  # a name swapped on the way (ELOOP, ENOTDIR...)
        raise Refused(f"it changed while it was copied ({exc.strerror}: {exc.filename or source})") from None
    finally:
        os.close(src)
    return budget.bytes


def _copy_dir(src: int, dst: int, where: str, budget: _Budget, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise Refused(f"its folders are nested more than {_MAX_DEPTH} deep (at {where})")
    for name in sorted(os.listdir(src)):
        path = f"{where}/{name}" if where else name
        st = os.lstat(name, dir_fd=src)
        budget.entry(path, st)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            os.mkdir(name, 0o700, dir_fd=dst)
            inner_src = os.open(name, _DIR, dir_fd=src)
            try:
                inner_dst = os.open(name, _DIR, dir_fd=dst)
                try:
                    _copy_dir(inner_src, inner_dst, path, budget, depth + 1)
                    os.fchmod(inner_dst, 0o555)
                finally:
                    os.close(inner_dst)
            finally:
                os.close(inner_src)
        elif stat.S_ISREG(mode):
            _copy_file(src, dst, name, path, budget)
        elif stat.S_ISLNK(mode):
            target = os.readlink(name, dir_fd=src)
            inside = not os.path.isabs(target) and ".." not in target.split("/")
            if not inside and target not in budget.links:
                raise Refused(f"{path} is a link out of the environment (to {target})")
            os.symlink(target, name, dir_fd=dst)
        else:
            raise Refused(f"{path} is not a file, a folder or a link")


def _copy_file(src: int, dst: int, name: str, where: str, budget: _Budget) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (budget.owner is not None and st.st_uid != budget.owner):
            raise Refused(f"{where} changed while it was copied")  # swapped since it was looked at
        budget.take(st.st_size, where)
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst)
        try:
            copied = 0
            while n := os.sendfile(out, fd, None, 1 << 24):
                copied += n
                if copied > st.st_size:  # it grows as it is copied: counted as it comes
                    budget.take(copied - st.st_size, where)
                    copied = st.st_size
            os.fchmod(out, 0o555 if st.st_mode & stat.S_IXUSR else 0o444)
        finally:
            os.close(out)
    finally:
        os.close(fd)
