"""The interface every backend implements."""

from __future__ import annotations

from typing import Protocol

from tlaunch.plan import LaunchPlan

__all__ = ["Backend"]


class Backend(Protocol):
    """Starts a plan's nodes and stops them; reports ends to the coordinator.

    A backend learns how nodes end (exit codes, vanished processes) and tells the
    run's coordinator, which decides what the run does about it.
    """

    def launch(self, plan: LaunchPlan) -> None:
        """Start every node of ``plan``; raise (having stopped what started) on failure."""

    def stop(self, grace: float) -> None:
        """Wait up to ``grace`` s for nodes to exit, then terminate, then kill them.

        Idempotent; returns once nothing the backend started is left.
        """
