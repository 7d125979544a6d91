"""What a run's coordinator knows of one node: :class:`NodeRecord`.

Apart from :mod:`tlaunch.runtime.coordinator` so that what reads records (the
coordinator's views, :mod:`tlaunch.runtime.observed`) shares one definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tlaunch.runtime import states

__all__ = ["NodeRecord"]


@dataclass
class NodeRecord:
    """What the coordinator knows of one node.

    ``paused``: while the node waits in a debugger (a ``breakpoint()``, a post-mortem),
    where and how (:class:`tlaunch.runtime.debugger.Pause` as a dict); None otherwise.
    ``debugged``: what a post-mortem pause of its last process came to (the failure
    report says it), None if it had none.
    """

    key: str
    host: str
    state: str = states.PENDING
    address: str | None = None
    pid: int | None = None
    pgid: int | None = None
    exit_code: int | None = None
    traceback: str | None = None
    reason: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    last_seen: float | None = None
    restarts: int = 0
    supervisor_pid: int | None = None
    paused: dict[str, Any] | None = None
    debugged: str | None = None
