"""Pack a folder for shipping to hosts: what a user means (ignore files honoured), measured, limited.

:func:`select` walks a folder with the ignore rules of :mod:`tlaunch.ssh.ignore`
and says what is shipped and what was left out (and by which file);
:func:`pack` makes the gzipped tar; :func:`pack_dir` does both, refusing a
folder whose shipped part is over a limit with the largest entries named and
the ways out.
"""

from __future__ import annotations

import os
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tlaunch.errors import LaunchError
from tlaunch.ssh.ignore import EXCLUDED, Entry, walk

__all__ = ["EXCLUDED", "TAR_END", "Packed", "Selection", "mib", "pack_dir", "select", "tar_file", "tar_files"]

_COUNT_BUDGET = 20_000  # entries looked at to size what the ignore files left out


def mib(n: float) -> str:
    """``n`` bytes for people: ``512 B``, ``3.2 KiB``, ``95.4 MiB``, ``9.3 GiB``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class Selection:
    """What :func:`select` found in a folder.

    Attributes:
        root: the folder, absolute.
        files: the files to ship: (path relative to ``root``, size in bytes).
        left_out: what the ignore files left out: (path, the ignore file, bytes,
            files); a folder's path ends with ``/``; bytes and files are
            lower bounds where counting stopped (``counted`` False).
        counted: whether every left-out folder was sized in full.
    """

    root: str
    files: tuple[tuple[str, int], ...]
    left_out: tuple[tuple[str, str, int, int], ...] = ()
    counted: bool = True

    @property
    def total(self) -> int:
        """Bytes to ship."""
        return sum(size for _, size in self.files)

    def largest(self, n: int = 5) -> list[tuple[str, int]]:
        """The ``n`` largest top-level entries shipped (a folder: ``name/``, its files summed)."""
        sizes: dict[str, int] = {}
        for path, size in self.files:
            head, sep, _ = path.partition("/")
            sizes[head + sep] = sizes.get(head + sep, 0) + size
        return sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def summary(self) -> str:
        """``12 files, 0.1 MiB; left out by .gitignore: data/ (9.3 GiB, 3 files), ...``."""
        text = f"{len(self.files)} file{'s' * (len(self.files) != 1)}, {mib(self.total)}"
        if self.left_out:
            by: dict[str, list[str]] = {}
            for path, source, size, count in sorted(self.left_out, key=lambda e: -e[2]):
                more = "+" if not self.counted and path.endswith("/") else ""
                files = f", {count}{more} file{'s' * (count != 1)}" if path.endswith("/") else ""
                by.setdefault(source, []).append(f"{path} ({mib(size)}{more}{files})")
            parts = [f"{', '.join(v[:4])}{', ...' if len(v) > 4 else ''} by {k}" for k, v in by.items()]
            text += "; left out: " + "; ".join(parts)
        return text


@dataclass(frozen=True)
class Packed:
    """A folder packed to ship: its files as tar blocks (no end marker), and what is in them."""

    members: bytes
    selection: Selection = field(repr=False)


def select(root: str, keep: Callable[[str, bool], bool] | None = None) -> Selection:
    """The files of ``root`` to ship (ignore files honoured), and what was left out.

    Raises:
        OSError: ``root`` cannot be read.
    """
    root = os.path.abspath(root)
    files: list[tuple[str, int]] = []
    left: list[tuple[str, str, int, int]] = []
    budget = [_COUNT_BUDGET]
    for entry in walk(root, keep):
        if entry.ignored_by is None:
            files.append((entry.path, entry.size))
        elif entry.ignored_by != "default":
            left.append((entry.path, entry.ignored_by, *_measure(entry, budget)))
    return Selection(root, tuple(files), tuple(left), counted=budget[0] > 0)


def _measure(entry: Entry, budget: list[int]) -> tuple[int, int]:
    """(bytes, files) of a left-out entry; a folder is sized until ``budget`` entries were seen."""
    if not entry.path.endswith("/"):
        return entry.size, 1
    size = count = 0
    for dirpath, dirnames, filenames in os.walk(entry.full):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED]
        for name in filenames:
            if budget[0] <= 0:
                return size, count
            budget[0] -= 1
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            size += st.st_size
            count += 1
    return size, count


TAR_END = b"\0" * 1024
"""The end of a tar archive: blocks from :func:`tar_file` and :func:`tar_files`, then this."""


def tar_file(name: str, data: bytes, mode: int = 0o600, kind: bytes = tarfile.REGTYPE) -> bytes:
    """One member (a file, or with ``kind=tarfile.DIRTYPE`` a folder) as tar blocks."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, len(data), int(time.time())
    pad = -len(data) % tarfile.BLOCKSIZE
    return info.tobuf(tarfile.PAX_FORMAT) + data + b"\0" * pad


def tar_files(items: Iterable[tuple[str, str]], prefix: str = "") -> bytes:
    """Files (absolute path, name) as tar blocks, each stored as ``prefix + name`` with its mode."""
    out = []
    for full, name in items:
        with open(full, "rb") as f:
            out.append(tar_file(prefix + name, f.read(), os.fstat(f.fileno()).st_mode & 0o777))
    return b"".join(out)


def pack_dir(path: str, limit_bytes: int, prefix: str = "") -> Packed:
    """``path`` packed to ship: its files but those the ignore files (and :data:`EXCLUDED`) leave out.

    Each is stored as ``prefix`` + its path in the folder.

    Raises:
        LaunchError: ``path`` is not a directory, or what is left holds more
            than ``limit_bytes`` (the message names the largest entries).
    """
    root = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(root):
        raise LaunchError(f"working_dir {path!r} is not a directory; give the folder to ship to every host")
    selection = select(root)
    if selection.total > limit_bytes:
        largest = ", ".join(f"{p} ({mib(n)})" for p, n in selection.largest())
        gone = sorted(selection.left_out, key=lambda e: -e[2])
        left = ", ".join(f"{p} ({mib(n)})" for p, _, n, _ in gone[:3]) + (", ..." if len(gone) > 3 else "")
        raise LaunchError(
            f"working_dir {path!r} holds {mib(selection.total)} to ship"
            f"{f' (the ignore files left out {left})' if gone else ''}, over the limit of "
            f"{limit_bytes / 2**20:g} MiB (working_dir_limit_mib); the largest: {largest}. Leave data "
            f"out with a .tlaunchignore in {root} (gitignore syntax, e.g. a line 'data/'; .gitignore "
            "is honoured too), keep it on a filesystem every host sees and launch with "
            "working_dir=False (tlaunch torchrun --no-ship) so that nothing is shipped, or raise "
            "working_dir_limit_mib"
        )
    return Packed(tar_files(((os.path.join(root, p), p) for p, _ in selection.files), prefix), selection)
