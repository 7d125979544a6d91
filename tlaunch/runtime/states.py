"""A run's node states and why a run stops: plain names, for whoever speaks of them.

Apart from :mod:`tlaunch.runtime.coordinator`, whose records and registry a
node process does not need (its runtime only names a stop's kind).
"""

from __future__ import annotations

__all__ = [
    "COMPLETED",
    "DONE",
    "FAILED",
    "FAILURE",
    "FAILURE_POLICIES",
    "PENDING",
    "REQUESTED",
    "RESTARTING",
    "RUNNING",
    "SERVING",
    "STARTING",
    "STOPPED",
    "STOP_KINDS",
    "TERMINAL_STATES",
    "UP_STATES",
    "is_up",
]

PENDING, STARTING, RUNNING, SERVING = "pending", "starting", "running", "serving"
RESTARTING = "restarting"
DONE, FAILED, STOPPED = "done", "failed", "stopped"
FAILURE_POLICIES = ("stop", "continue")
COMPLETED, REQUESTED, FAILURE = "completed", "requested", "failed"
STOP_KINDS = (COMPLETED, REQUESTED, FAILURE)
"""Why a stop began: the program ended itself, someone stopped it from outside, a node failed."""
TERMINAL_STATES = frozenset({DONE, FAILED, STOPPED})
UP_STATES = frozenset({RUNNING, SERVING, DONE})
"""A node that is up (it serves or runs), or was (done): what ``Run.wait_ready`` waits for."""


def is_up(state: str | None, address: str | None) -> bool:
    """Whether a node in ``state``, registered at ``address`` (None: not yet), is up: its
    address registered (it serves), or a state of :data:`UP_STATES`."""
    return address is not None or state in UP_STATES
