"""Set-ups every node process runs before its node is unpickled, registered in the launcher's process.

A layer above the runtime that changes how the launcher's process imports
(:func:`tlaunch.compat.install` aliases ``launchpad``) registers here what a node
process must do the same, so that what the launcher pickled by reference unpickles
there. Each set-up is a picklable callable without arguments
(``functools.partial`` of a module-level function).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["node_setups", "register_node_setup", "unregister_node_setup"]

_lock = threading.Lock()
_setups: list[Callable[[], None]] = []


def register_node_setup(setup: Callable[[], None]) -> None:
    """Have every node of later launches call ``setup()`` first (once, however often registered)."""
    with _lock:
        if setup not in _setups:
            _setups.append(setup)


def unregister_node_setup(setup: Callable[[], None]) -> None:
    """Forget ``setup``."""
    with _lock:
        if setup in _setups:
            _setups.remove(setup)


def node_setups() -> tuple[Callable[[], None], ...]:
    """The registered set-ups, in registration order."""
    with _lock:
        return tuple(_setups)
