"""The collector: one node per torch job, on the head host, that agents and the launcher meet at.

Agents register (their worker counts, the head's master address) and get the
whole layout back; they publish values (a rendezvous endpoint) for each other;
they report each host's outcome: results, a worker's failure, a job's exit
(typed records of :mod:`tlaunch.torch.outcomes`). The launcher long-polls
:meth:`Collector.wait` and fetches the results. Nothing here imports torch:
results and exceptions stay pickled bytes until the launcher opens them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tlaunch.errors import RPCError
from tlaunch.torch.outcomes import HostOutcome, JobOutcome, RankError, WorkerFailure

__all__ = ["ROOT_CAUSE_WINDOW", "Collector", "tell"]

ROOT_CAUSE_WINDOW = 1.0
"""Seconds after the first failure report during which an earlier failure may still arrive from
another host (less once every agent has reported: nothing else can)."""


_ENDING = 10.0
"""Seconds an agent whose report found the collector gone waits for the program's stop."""


def tell(report: Callable[[], object], stop: threading.Event) -> None:
    """Send an agent's outcome (``report``: its call to the collector).

    The launcher stops the program as soon as the collector has the outcome,
    and the collector may end before its answer reaches the agent (an agent's
    ``EOFError: ... closed the connection`` traceback, at the end of a launch
    that succeeded). A lost connection followed by the program's stop is
    that, not an error.

    Raises:
        RPCError: the collector cannot be reached, and the program goes on.
    """
    try:
        report()
    except RPCError:
        if stop.wait(_ENDING):
            return
        raise


class Collector:
    """What the agents of one torch job and its launcher share (served as a ``CourierNode``).

    Args:
        n_agents: how many agents (hosts) the job has.
    """

    def __init__(self, n_agents: int) -> None:
        self.n_agents = n_agents
        self._cond = threading.Condition()
        self._infos: dict[int, dict[str, Any]] = {}
        self._values: dict[str, Any] = {}
        self._outcomes: dict[int, HostOutcome] = {}
        self._failures: list[WorkerFailure] = []
        self._errors: list[RankError] = []
        self._first_failure: float | None = None

    def register(self, index: int, info: dict[str, Any], timeout: float = 600.0) -> list[dict[str, Any]]:
        """Agent ``index`` says what it has; returns every agent's info once all have registered.

        Raises:
            TimeoutError: not every agent registered within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._infos[index] = info
            self._cond.notify_all()
            while len(self._infos) < self.n_agents and not self._failures:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(self.n_agents)) - set(self._infos))
                    raise TimeoutError(f"agents {missing} did not register within {timeout:.0f} s")
                self._cond.wait(min(left, 1.0))
            if self._failures:
                raise RuntimeError("the job failed before every agent registered")
            return [self._infos[i] for i in range(self.n_agents)]

    def publish(self, key: str, value: Any) -> None:
        """Make ``value`` known as ``key`` to every agent."""
        with self._cond:
            self._values[key] = value
            self._cond.notify_all()

    def lookup(self, key: str, timeout: float = 600.0) -> Any:
        """The value published as ``key``, waiting up to ``timeout`` seconds for it.

        Raises:
            TimeoutError: nobody published it in time.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self._values:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"nothing was published as {key!r} within {timeout:.0f} s")
                self._cond.wait(min(left, 1.0))
            return self._values[key]

    def finished(self, index: int, outcome: HostOutcome) -> None:
        """Agent ``index`` is done: its workers' results, or its job's exit status."""
        with self._cond:
            self._outcomes[index] = outcome
            self._cond.notify_all()

    def error(self, index: int, error: RankError) -> None:
        """Agent ``index`` found a rank's error report (torchrun mode: ranks fail and restart)."""
        with self._cond:
            self._errors.append(error)

    def failed(self, index: int, failures: list[WorkerFailure]) -> None:
        """Agent ``index`` saw workers (or its host's launcher) fail.

        The root cause is the earliest failure (by the time each agent dated it: a death
        when its worker was last seen running, an error when it was raised) reported within
        :data:`ROOT_CAUSE_WINDOW` seconds of the first report, or before every agent has
        reported: a peer's error in a collective often reaches its agent, and the
        collector, before the failure that caused it, and a busy host's agent reports late.
        """
        with self._cond:
            self._failures.extend(failures)
            self._outcomes.setdefault(index, HostOutcome(failures=tuple(failures)))
            if self._first_failure is None:
                self._first_failure = time.monotonic()
            self._cond.notify_all()

    def wait(self, timeout: float = 1.0, ended: list[int] | None = None) -> JobOutcome | None:
        """Long poll: the job's outcome once it is known, else None after ``timeout`` seconds.

        Args:
            timeout: the most seconds to wait.
            ended: agents the launcher knows are gone (they will report nothing).

        Returns:
            The outcome with its root-cause ``failure`` as soon as one is reported
            (and the window for an earlier one has passed, or every agent not in
            ``ended`` has reported), or once every agent not in ``ended`` has reported.
        """
        gone = set(ended or ())
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                reported = all(i in self._outcomes or i in gone for i in range(self.n_agents))
                if self._first_failure is not None:
                    settle = self._first_failure + ROOT_CAUSE_WINDOW - time.monotonic()
                    if settle <= 0 or reported:
                        return JobOutcome(
                            dict(self._outcomes),
                            tuple(self._errors),
                            min(self._failures, key=lambda f: f.time),
                            tuple(self._failures),
                        )
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    self._cond.wait(min(settle, left))
                    continue
                if reported:
                    return JobOutcome(dict(self._outcomes), tuple(self._errors))
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
