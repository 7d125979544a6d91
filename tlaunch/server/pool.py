"""The job server's pool of SSH hosts (``tlaunch server --pool pool.yaml``): its jobs, from submit to release.

A server with a pool places every job that names no place of its own (no
``hosts``, ``slurm`` or ``kubernetes``) on the pool's hosts
(:mod:`tlaunch.pool`)::

    POST /v1/trainer/job ──▶ check (a job that never fits: 400) ──▶ row written (PENDING),
                             queued in the pool's service (its place, its reason)
    placed ──▶ row's "pool" column: the placement (hosts, GPUs, CPUs), TLAUNCH_POOL_SLOTS, the
               ssh config ──▶ launch(name): the job runs on those hosts (job_of reads the column)
    ended (the watcher keeps its end) ──▶ service.ended: each host freed once the run's
               processes there are gone
    server start ──▶ recover: running jobs hold their placements again, waiting ones queue
               in submission order, ended ones whose hosts were not freed are checked

The row keeps the placement (with the time it was held) so a server killed at
any point places nothing twice: a job with a placement is never queued again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from tlaunch.pool import NeverFits, Placement, PoolConfig, Request, Waiting, load_pool
from tlaunch.pool.errors import HoldingConflict
from tlaunch.pool.probe import Prober
from tlaunch.pool.resources import parse_memory
from tlaunch.pool.service import PoolService
from tlaunch.runtime.slots import SLOTS
from tlaunch.server.deps import ApiError
from tlaunch.server.models import SubmitJob
from tlaunch.server.store import JobRow, JobStore

__all__ = [
    "ServerPool",
    "check_pool_fields",
    "in_pool",
    "key_of",
    "placement_target",
    "pooled",
    "request_of",
    "requeued",
    "scheduled",
    "waits",
]

log = logging.getLogger(__name__)

_PLACES = ("hosts", "slurm", "kubernetes")


def in_pool(spec: Mapping[str, Any]) -> bool:
    """Whether a job of ``spec`` is the pool's to place (it names no place of its own)."""
    return not any(spec.get(k) for k in _PLACES)


def key_of(row: JobRow) -> str:
    """The pool's name for ``row``'s job: ``owner/name`` (job names are per user)."""
    return f"{row.owner}/{row.name}"


def pooled(row: JobRow) -> bool:
    """Whether ``row``'s job is the pool's (it was admitted to its queue)."""
    return bool((row.scheduling or {}).get("pooled"))


def request_of(spec: Mapping[str, Any], trainers: int) -> Request:
    """What each of the ``trainers`` of a job (its spec, the submit body) asks of the pool.

    Raises:
        ValueError: a value the pool cannot take (its memory, say).
    """
    gpus = int(spec.get("gpu_num") or 0) if spec.get("use_gpu") else 0
    memory = parse_memory(spec["memory"]) if spec.get("memory") else 0
    return Request(
        trainers=trainers,
        gpus=gpus,
        cpus=int(spec.get("cpu_num") or 1),
        memory=memory,
        label=spec.get("gpu_label") or None,
        pool=spec.get("pool") or None,
    )


def placement_target(row: JobRow) -> tuple[tuple[str, ...], str | None, dict[str, str]] | None:
    """A placed job's hosts (rank order), ssh config and more environment, from its row (None: not placed)."""
    placed = (row.scheduling or {}).get("placement")
    if not placed:
        return None
    hosts = tuple(str(s["host"]) for s in placed["slots"])
    return hosts, placed.get("ssh_config"), {SLOTS: str(placed["env"])}


def waits(row: JobRow) -> bool:
    """Whether ``row``'s job waits in the pool's queue (not placed yet): not for the launches."""
    return pooled(row) and not (row.scheduling or {}).get("placement")


def check_pool_fields(body: SubmitJob, admin: bool, pool: ServerPool | None) -> None:
    """Refuse what a job asks of a pool that it may not, or that is not there.

    Raises:
        ApiError: 403 for a priority given by a user who is not an admin; 400 for a pool's
            field on a server without one, or a job that names one of the pool's hosts.
    """
    if body.priority and not admin:
        raise ApiError(403, f"priority={body.priority}: only an admin sets a job's priority; leave it 0")
    if pool is None and (body.gpu_label or body.pool):
        raise ApiError(400, "gpu_label and pool ask the server's pool, and this server has none")
    ours = sorted(set(body.hosts or ()) & set(pool.service.state.names)) if pool is not None else []
    if ours:
        raise ApiError(
            400, f"hosts {ours} are the pool's: leave hosts out, and the pool places the job there"
        )


def requeued(row: JobRow, pool: ServerPool | None) -> dict[str, Any] | None:
    """``row``'s scheduling for a new run of it: a pool's job without its last placement."""
    if row.scheduling is None:
        return None
    return {k: v for k, v in row.scheduling.items() if k not in ("placement", "released")}


def scheduled(row: JobRow) -> dict[str, Any]:
    """What a job's JSON says of its scheduling from its row: a pool's job its ``placement``, a job
    run again its ``restarts`` (a waiting job's ``queue`` place changes without its row: it is
    added as the job is answered, :meth:`ServerPool.queue_of`)."""
    out: dict[str, Any] = {}
    sched = row.scheduling or {}
    if pooled(row):
        placed = sched.get("placement")
        out["placement"] = placed["slots"] if placed else None
    if sched.get("restarts"):
        out["restarts"] = {"count": sched["restarts"], "runs": sched.get("runs", [])}
    return out


class ServerPool:
    """A server's pool (see the module docstring).

    Args:
        config: the pool.
        home: the server's home (the placement log is ``<home>/server/placements.log``).
        store: its table of jobs.
        launch: launches job ``owner/name`` once its placement is in its row.
        prober: asks the hosts (default: over the pool's ssh config).
    """

    def __init__(
        self,
        config: PoolConfig,
        home: str,
        store: JobStore,
        launch: Callable[[str], object],
        prober: Prober | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.launch = launch
        journal = os.path.join(home, "server", "placements.log")
        self.service = PoolService(config, self._placed, journal, prober, released=self._released)

    @classmethod
    def load(cls, path: str, home: str, store: JobStore, launch: Callable[[str], object]) -> ServerPool:
        """The pool of the file at ``path`` (checked: :class:`~tlaunch.pool.PoolConfigError`)."""
        return cls(load_pool(path), home, store, launch)

    # -- the server's life --------------------------------------------------------------
    def open(self) -> None:
        """Rebuild the holdings and the queue from the jobs' rows, probe, start scheduling."""
        self.recover()
        self.service.open()

    def close(self) -> None:
        """Stop scheduling and probing."""
        self.service.close()

    def recover(self) -> None:
        """What the jobs' rows say: running jobs hold their placements, waiting ones queue (oldest first)."""
        for row in sorted(self.store.list(limit=1 << 30), key=lambda r: r.created):
            if not pooled(row) or row.scheduling is None:
                continue
            placed = row.scheduling.get("placement")
            if placed is None:
                if row.final is None:
                    self.service.enqueue(self._waiting(row))
                continue
            if row.scheduling.get("released"):
                continue
            key = key_of(row)
            try:
                self.service.recover(key, row.owner, Placement.from_dict(placed["slots"]), placed["at"])
            except HoldingConflict as exc:  # two rows on one GPU: said loud; the first keeps it
                log.error("job %s: its placement is held by another job: %s", key, exc)
                continue
            if row.final is not None:  # it ended while no server watched: its hosts are checked now
                self.ended(row)
            # placed and not launched yet: the server's launches launch it (as any accepted job)

    # -- jobs ---------------------------------------------------------------------------
    def admit(self, owner: str, spec: Mapping[str, Any], trainers: int) -> dict[str, Any]:
        """Check a job of ``trainers`` the pool would place; what its row keeps of the pool.

        Raises:
            ApiError: 400, it asks for what the pool cannot take or could never give.
        """
        if spec.get("gpu_num") and not spec.get("use_gpu"):
            raise ApiError(
                400,
                f"gpu_num={spec['gpu_num']} without use_gpu asks for no GPU: set use_gpu true (--gpus does)",
            )
        try:
            request = request_of(spec, trainers)
            self.service.check(owner, request)
        except NeverFits as exc:
            raise ApiError(400, f"the pool cannot ever place it: {exc}") from None
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return {"pooled": True, "priority": int(spec.get("priority") or 0), "trainers": trainers}

    def enqueue(self, row: JobRow) -> None:
        """Queue ``row``'s job (its row written)."""
        self.service.enqueue(self._waiting(row))

    def ended(self, row: JobRow) -> None:
        """``row``'s job ended, failed, was stopped, lost or deleted: out of the queue, its hosts freed."""
        if not self.service.withdraw(key_of(row)):  # its run, or the run its launch was given
            self.service.ended(key_of(row), row.run_id or row.planned_run)

    def hosts_up(self, row: JobRow) -> bool:
        """Whether every host of ``row``'s placement answers now (asked now: a probe of them)."""
        placed = placement_target(row)
        names = list(dict.fromkeys(placed[0] if placed else ()))
        self.service.probe(names)
        hosts = [self.service.state.host(h) for h in names]
        return all(h is not None and h.up for h in hosts)

    def requeue(self, row: JobRow, run_id: str | None) -> None:
        """Queue ``row``'s job again in its first place, once its run ``run_id`` left the hosts it held."""
        self.service.requeue(self._waiting(row), run_id)

    def set_priority(self, row: JobRow, priority: int) -> None:
        """Set a job's priority (its row and, if it waits, its place in the queue)."""
        self.store.update(row.owner, row.name, scheduling={**(row.scheduling or {}), "priority": priority})
        self.service.set_priority(key_of(row), priority)

    def queue_of(self, row: JobRow) -> dict[str, Any] | None:
        """A waiting job's place and reason (``{"position", "reason"}``), or None."""
        wait = self.service.wait_of(key_of(row))
        return None if wait is None else {"position": wait.position, "reason": wait.reason}

    def view(self, may_see: Callable[[str], bool]) -> dict[str, Any]:
        """``GET /v1/pool``: jobs as ``owner/name``; those of another user a user may not see, as such."""
        out = self.service.view()
        hidden = "(another user's job)"

        def shown(key: str) -> str:
            return key if may_see(key.partition("/")[0]) else hidden

        for host in out["hosts"]:
            for gpu in host["gpus"]:
                if gpu["job"] is not None:
                    gpu["job"] = shown(gpu["job"])
            host["jobs"] = sorted({shown(j) for j in host["jobs"]})
        out["queue"] = [{**q, "job": shown(q["job"])} for q in out["queue"]]
        return out

    def _waiting(self, row: JobRow) -> Waiting:
        sched = row.scheduling or {}
        request = request_of(row.spec, int(sched.get("trainers") or 1))
        return Waiting(key_of(row), row.owner, request, row.created, int(sched.get("priority") or 0))

    def _row(self, key: str) -> JobRow | None:
        owner, _, name = key.partition("/")
        return self.store.get(owner, name)

    def _released(self, key: str) -> None:
        row = self._row(key)
        if row is not None and row.scheduling is not None and row.final is not None:
            self.store.update(row.owner, row.name, scheduling={**row.scheduling, "released": True})

    def _placed(self, key: str, placement: Placement) -> None:
        """The service held ``placement`` for job ``key``: keep it in the row, then launch the job."""
        row = self._row(key)
        if row is None or row.final is not None:  # deleted or stopped as it was placed
            self.service.ended(key, None)
            return
        record = {
            "slots": placement.to_dict(),
            "env": self.service.slots_of(placement),
            "ssh_config": self.config.ssh_config,
            "at": time.time(),
        }
        self.store.update(row.owner, row.name, scheduling={**(row.scheduling or {}), "placement": record})
        self.launch(key)
