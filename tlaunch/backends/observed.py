"""Handles that can only look at their run, and the one raise policy of ``join``.

:func:`raise_for` is what every handle's ``join`` does with an ended run: its
snapshot, or its root cause's error if it failed. :class:`Observed` is the
``join`` of a handle that follows its run by looking (its record, its
coordinator, its scheduler); :class:`Scheduled`, the ``snapshot`` of a run a
scheduler holds (a SLURM batch job, an LPJob): its record once it has ended,
else the scheduler's word.
"""

from __future__ import annotations

import time

from tlaunch.backends.handle import Failure, RunSnapshot, RunState
from tlaunch.runtime.records import RunRecord

__all__ = ["Observed", "Scheduled", "raise_for"]


def raise_for(snapshot: RunSnapshot) -> RunSnapshot:
    """``snapshot`` of an ended run, or its root cause's error if it failed (the one raise policy).

    Raises:
        RunFailedError: the run failed (also of the failing node's built-in exception type).
    """
    if snapshot.state is RunState.FAILED:
        failure = snapshot.failure or Failure(node="?", reason=snapshot.reason or "the run failed")
        raise failure.error()
    return snapshot


class Observed:
    """A handle that can only look at its run (from its record, its scheduler, its cluster): its
    :meth:`join` polls :meth:`snapshot`, every :attr:`join_poll` s, until the run has ended."""

    join_poll: float = 0.5
    """Seconds between two looks while joining."""

    def snapshot(self) -> RunSnapshot:
        """The run now (the subclass's)."""
        raise NotImplementedError

    def join(self, timeout: float | None = None) -> RunSnapshot:
        """Block until the run has ended; its final snapshot (:meth:`RunHandle.join`).

        Raises:
            RunFailedError: it failed: its root cause's error (see :func:`raise_for`).
            TimeoutError: it had not ended after ``timeout`` s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if snap.ended:
                return raise_for(snap)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {snap.run_id} is still {snap.state} after {timeout} s")
            wait = self.join_poll if deadline is None else min(self.join_poll, deadline - time.monotonic())
            time.sleep(max(0.0, wait))


class Scheduled(Observed):
    """A run its scheduler holds (a SLURM batch job, an LPJob): once its record says it ended, the
    record says how; until then, its scheduler is asked (:meth:`_asked`)."""

    def snapshot(self) -> RunSnapshot:
        """The run now: from its record once it has ended, else from its scheduler."""
        record = self._record_now()
        if record is not None and record.ended:
            return self._recorded(record)
        return self._asked(record)

    def _record_now(self) -> RunRecord | None:
        """The run's record as it is on disk now (None: none, or unreadable)."""
        raise NotImplementedError

    def _recorded(self, record: RunRecord) -> RunSnapshot:
        """The ended run, as its record says."""
        raise NotImplementedError

    def _asked(self, record: RunRecord | None) -> RunSnapshot:
        """The run as its scheduler says now (``record``: as recorded so far)."""
        raise NotImplementedError
