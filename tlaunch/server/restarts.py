"""A job's restarts (``restart_policy: OnFailure``, ``backoff_limit: N``): run it again when it fails.

When the server sees a job's run end ``FAILED`` or ``LOST`` and the job has
restarts left, the end is not kept: the job runs again, as a new run, and
its row says so (``scheduling.restarts``, and each earlier run with how it
ended, in ``scheduling.runs``); its state is ``PENDING`` until the new run
starts. Where it runs again:

- a job of the pool whose hosts all answer: **on the same placement** (it keeps
  its place and its GPUs), once nothing of the failed run is left on them;
- a job of the pool one of whose hosts is down: **queued again**, in its first
  place (its submission time), once the hosts it held are free;
- any other job on hosts or SLURM: submitted again where it was.

On Kubernetes the LPJob's own ``restartPolicy`` and ``backoffLimit`` do it
(the operator restarts the pods); the server does not. (The names are
Kubernetes' Job's: ``max_restarts`` is torchrun's, the restarts of its worker
group inside one run.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tlaunch.server.jobs import JobView
from tlaunch.server.pool import ServerPool, key_of, pooled
from tlaunch.server.store import JobRow, JobStore

__all__ = ["Restarts"]

_AGAIN = frozenset({"FAILED", "LOST"})


class Restarts:
    """Decides, as a job's end is seen, whether it runs again (see the module docstring).

    Args:
        store: the jobs' table.
        pool: the server's pool, if it has one.
        relaunch: launches job ``owner/name`` again (its row has no run).
    """

    def __init__(self, store: JobStore, pool: ServerPool | None, relaunch: Callable[[str], object]) -> None:
        self.store = store
        self.pool = pool
        self.relaunch = relaunch
        self._lock = threading.Lock()

    def __call__(self, row: JobRow, view: JobView) -> bool:
        """Whether ``row``'s job, whose run ended as ``view`` says, runs again (then its end is not kept)."""
        spec, old = row.spec, row.run_id
        if spec.get("restart_policy") != "OnFailure" or spec.get("kubernetes") or view.state not in _AGAIN:
            return False
        with self._lock:  # the watcher and requests see the same end: one of them restarts it
            current = self.store.get(row.owner, row.name)
            if current is None or current.final is not None:
                return False
            if current.run_id != row.run_id:  # restarted already
                row.run_id = current.run_id
                return True
            sched: dict[str, Any] = dict(current.scheduling or {})
            done = int(sched.get("restarts") or 0)
            limit = int(spec.get("backoff_limit") or 0)
            if done >= limit:
                return False
            sched["restarts"] = done + 1
            sched["runs"] = [*sched.get("runs", []), {"run_id": row.run_id, "state": view.state,
                                                      "message": view.message}]  # fmt: skip
            message = (
                f"restart {done + 1} of {limit}: its run {row.run_id} ended {view.state}: {view.message}"
            )
            requeue = False
            if self.pool is not None and pooled(current):
                requeue = not self.pool.hosts_up(current)
                if requeue:
                    sched.pop("placement", None)
            self.store.update(row.owner, row.name, run_id=None, message=message, scheduling=sched,
                              started=None, planned_run=None)  # fmt: skip
            row.run_id, row.message, row.scheduling = None, message, sched
        if self.pool is not None and pooled(row):
            if requeue:
                self.pool.requeue(row, old)
            else:
                self.pool.service.rerun(key_of(row), str(old), self.relaunch)
        else:
            self.relaunch(key_of(row))
        return True
