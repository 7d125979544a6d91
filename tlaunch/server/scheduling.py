"""What the server schedules of its jobs, behind one object its routes ask: its pool and restarts.

::

    submit ──▶ admit (a pool's fields checked; a job that never fits: 400) ──▶ queued in the pool,
               or accepted by the launches at once
    placed by the pool ──▶ its placement in its row ──▶ accepted by the launches (run there)
    a run's end seen ──▶ restarts (restart_policy OnFailure) or kept ──▶ ended: the pool frees its hosts
    stop of a job not launched ──▶ STOPPED ──▶ ended: out of the queue, or its hosts freed
    restart (POST .../restart) ──▶ a pool's job queued again; others accepted at once
    delete ──▶ ended

Without ``--pool`` only restarts apply: every job is launched as it is accepted.
"""

from __future__ import annotations

from typing import Any

from tlaunch.server.launches import Launches
from tlaunch.server.models import SubmitJob
from tlaunch.server.pool import ServerPool, check_pool_fields, in_pool, pooled, requeued, waits
from tlaunch.server.restarts import Restarts
from tlaunch.server.store import JobRow, JobStore
from tlaunch.server.watcher import Watcher

__all__ = ["Scheduling"]


class Scheduling:
    """A server's scheduling (see the module docstring); it hooks itself to ``launches`` and ``watcher``.

    Args:
        pool_file: its ``pool.yaml`` (None: no pool).
        home: the server's home.
        store: its jobs.
        launches: launches its accepted jobs.
        watcher: follows its running jobs.
    """

    def __init__(
        self, pool_file: str | None, home: str, store: JobStore, launches: Launches, watcher: Watcher
    ) -> None:
        self.launches = launches
        self.pool = ServerPool.load(pool_file, home, store, self._launch) if pool_file else None
        self.restarts = Restarts(store, self.pool, self._launch)
        watcher.restart, watcher.on_end, launches.on_end = self.restarts, self.ended, self.ended
        launches.waits = waits

    def _launch(self, key: str) -> None:
        owner, _, name = key.partition("/")
        self.launches.accept(owner, name)

    def open(self) -> None:
        """Start the pool (its first probe and round: a first request sees both)."""
        if self.pool is not None:
            self.pool.open()

    def close(self) -> None:
        """Stop the pool."""
        if self.pool is not None:
            self.pool.close()

    def ended(self, row: JobRow) -> None:
        """A job ended (or was stopped, or deleted): a pool's job leaves the queue, or frees its hosts
        as its processes go."""
        if self.pool is not None and pooled(row):
            self.pool.ended(row)

    def admit(self, body: SubmitJob, admin: bool, row: JobRow, trainers: int) -> None:
        """Check what a submit asks of the pool; a job the pool will place gets its ``scheduling``.

        Raises:
            ApiError: 403 (a priority from a user who is not an admin), 400 (what the pool cannot take).
        """
        check_pool_fields(body, admin, self.pool)
        if self.pool is not None and in_pool(row.spec):
            row.scheduling = self.pool.admit(row.owner, row.spec, trainers)

    def accept(self, row: JobRow) -> None:
        """A job accepted (its row written): queued in the pool, or launched."""
        if self.pool is not None and pooled(row):
            self.pool.enqueue(row)
        else:
            self.launches.accept(row.owner, row.name)

    def again(self, row: JobRow) -> dict[str, Any] | None:
        """``row``'s scheduling for a new run of it (a pool's job: without its last placement)."""
        return requeued(row, self.pool)

    def restart(self, row: JobRow, old_run: str | None) -> None:
        """A new run of an ended job (its row reset): a pool's job is queued again once its last
        run left its hosts; another is launched."""
        if self.pool is not None and pooled(row):
            self.pool.requeue(row, old_run)
        else:
            self.launches.accept(row.owner, row.name)

    def queue_of(self, row: JobRow) -> dict[str, Any] | None:
        """A waiting job's place in the pool's queue and why it waits (None: it does not wait there)."""
        return self.pool.queue_of(row) if self.pool is not None and waits(row) and row.final is None else None
