"""Run a check in a forked child of the test process and get its verdict back."""

from __future__ import annotations

import os
from collections.abc import Callable


def in_forked_child(check: Callable[[], bool]) -> bool:
    """Whether ``check()`` returned True in a forked child (False if it raised or returned False).

    The child leaves with ``os._exit``: none of the test process's exit handlers runs twice.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = False
        try:
            os.close(r)
            ok = check()
        finally:
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
    os.close(w)
    try:
        return os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
