"""Process checks shared by every layer (no tlaunch imports)."""

from __future__ import annotations

import os

__all__ = ["pid_exists"]


def pid_exists(pid: int) -> bool:
    """Whether a process with ``pid`` exists (another user's counts; a zombie too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
