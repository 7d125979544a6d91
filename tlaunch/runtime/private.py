"""A run's private files: written whole and 0600, or read once and deleted (they hold its secrets).

Apart from :mod:`tlaunch.runtime.records`: a node's supervisor and the head take
their files with this alone.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from typing import TypeVar

__all__ = ["take_file", "write_private"]


def write_private(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (written aside, then renamed), mode 0600.

    The file aside has a name of its own per call: two writers at once (a
    launcher recording its run's end while ``tlaunch ps`` or the job server
    records it too) never rename each other's half-written file.
    """
    import tempfile  # here: with shutil and random, ~2 ms of every node's start

    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp: mode 0600
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


T = TypeVar("T")


def take_file(path: str, kind: type[T]) -> T:
    """Read the pickled ``kind`` at ``path`` and delete the file (it holds the run's secrets).

    The file stays where the object's ``keep`` attribute is true (``keep_bundles=True``).

    Raises:
        TypeError: the file holds something else.
    """
    with open(path, "rb") as f:
        obj = pickle.load(f)
    if not getattr(obj, "keep", False):
        os.unlink(path)
    if not isinstance(obj, kind):
        raise TypeError(f"{path} holds no tlaunch {kind.__name__}")
    return obj
