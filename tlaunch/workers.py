"""A node of a run as a process of Launchpad's worker manager (``run.wait`` on groups, ``returncode``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from tlaunch.runtime.states import TERMINAL_STATES

__all__ = ["NodeWorker"]


class NodeWorker:
    """One node of a run, seen as a process of Launchpad's worker manager."""

    def __init__(self, status: Callable[[], Mapping[str, Mapping[str, Any]]], key: str) -> None:
        self._status = status
        self.key = key

    @property
    def returncode(self) -> int | None:
        """Its exit code once it has ended (None before)."""
        rec = self._status().get(self.key, {})
        return rec.get("exit_code") if rec.get("state") in TERMINAL_STATES else None

    @property
    def pid(self) -> int | None:
        """Its process id, once started."""
        pid: int | None = self._status().get(self.key, {}).get("pid")
        return pid

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait until the node has ended; its exit code."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._status().get(self.key, {}).get("state") not in TERMINAL_STATES:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"node {self.key!r} did not end within {timeout} s")
            time.sleep(0.02)
        return self.returncode

    def __repr__(self) -> str:
        return f"NodeWorker({self.key!r})"
