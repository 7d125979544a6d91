"""The pool at work in a server: probes, the queue, holdings and placements, in threads of its own.

::

    probe thread ── every probe_every s: Prober.probe(all hosts) ─▶ PoolState ─┐ a host changed
    enqueue(job) / priority / a host freed ──────────────────────────────────────┤
                                                                                 ▼
    schedule thread ── queue.schedule(hosts, holdings, waiting, limits)
                        ├─ each start: held, journalled, then start(name, placement) (the server
                        │  records it and launches the job: its hosts, its slots' variable)
                        └─ each wait: its position and reason (wait_of)
    ended(job, run_id) ── per host, in a worker: Prober.after(host, run_id) until nothing of the
                          run is left (grace s at most; a host down: at once), then a fresh look at
                          its GPUs' processes; released, journalled; the schedule thread wakes

A job's resources are held from before it starts until its last process on
each host is gone; what holds what is only in memory and the journal, and the
server rebuilds it at start from its jobs (:meth:`PoolService.recover`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tlaunch.errors import SSHError
from tlaunch.pool.config import PoolConfig
from tlaunch.pool.errors import HoldingConflict, NeverFits
from tlaunch.pool.holdings import Holdings
from tlaunch.pool.journal import Journal
from tlaunch.pool.probe import Prober
from tlaunch.pool.queue import Round, Wait, Waiting, schedule
from tlaunch.pool.reasons import never_fits
from tlaunch.pool.resources import Placement, Request, format_cpus
from tlaunch.pool.state import PoolState

__all__ = ["PoolService", "Start"]

log = logging.getLogger(__name__)

Start = Callable[[str, Placement], None]
"""What the server does with a job once its placement is held: record it, launch the job."""


class PoolService:
    """The server's pool (see the module docstring); thread-safe.

    Args:
        config: the pool (``pool.yaml``).
        start: called (in the schedule thread) with each job placed; what it raises
            releases the job's placement (the server fails the job itself).
        journal: the file of the placement log.
        prober: asks the hosts (default: over ``config.ssh_config``).
        grace: seconds a host's resources wait, once its job ended, for the job's last processes.
        check_every: seconds between two looks at what is left of an ended job.
        released: called with a job's name once all it held is free (the server notes it).
    """

    def __init__(
        self,
        config: PoolConfig,
        start: Start,
        journal: str,
        prober: Prober | None = None,
        grace: float = 30.0,
        check_every: float = 0.25,
        released: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.state = PoolState(config)
        self.holdings = Holdings()
        self.prober = prober or Prober(config.ssh_config)
        self.journal = Journal(journal)
        self.grace, self.check_every = grace, check_every
        self._start = start
        self._released = released
        self._lock = threading.RLock()
        self._waiting: dict[str, Waiting] = {}
        self._last = Round()
        self._leaving: dict[str, set[str]] = {}  # job -> hosts whose release is being checked
        self._requeue: dict[str, Waiting] = {}  # jobs queued again once all they held is free
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers = ThreadPoolExecutor(8, thread_name_prefix="pool release")

    # -- lifecycle ------------------------------------------------------------------------
    def open(self) -> None:
        """Probe every host once and take a first round (a first request sees both), then start
        probing and scheduling."""
        self.probe()
        self._round()
        for name, target in (("pool probe", self._probe_loop), ("pool schedule", self._schedule_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._wake.set()

    def close(self) -> None:
        """Stop its threads and close its connections (holdings are rebuilt by the next server)."""
        self._closed.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(10)
        self._workers.shutdown(wait=True, cancel_futures=True)
        self.prober.close()
        self.journal.close()

    def probe(self, hosts: Sequence[str] | None = None) -> list[str]:
        """Probe ``hosts`` (default: all) now; the hosts that changed (the queue is looked at again)."""
        changed = self.state.update(self.prober.probe(list(hosts or self.state.names)))
        if changed:
            self._wake.set()
        return changed

    # -- jobs -------------------------------------------------------------------------------
    def check(self, user: str, request: Request) -> None:
        """Refuse a job that could never run here.

        Raises:
            NeverFits: what it asks, against what the pool has (the message says both).
        """
        said = never_fits(request, self.state.hosts(), self.config.limits.gpus_of(user))
        if said is not None:
            raise NeverFits(said)

    def enqueue(self, job: Waiting) -> None:
        """Queue ``job`` (its ``seq``, the time it was submitted, keeps its place across restarts)."""
        with self._lock:
            if job.job not in self.holdings and job.job not in self._waiting:
                self._waiting[job.job] = job
        self._wake.set()

    def recover(self, job: str, user: str, placement: Placement, since: float) -> None:
        """Hold again what a running job held before the server restarted (nothing is journalled again).

        Raises:
            HoldingConflict: another job holds part of it (two jobs recorded on one GPU).
        """
        with self._lock:
            self._waiting.pop(job, None)
            self.holdings.hold(job, user, placement, since)

    def withdraw(self, job: str) -> bool:
        """Take a waiting ``job`` out of the queue (stopped or deleted); whether it was waiting."""
        with self._lock:
            found = self._waiting.pop(job, None) is not None
        if found:
            self._wake.set()
        return found

    def set_priority(self, job: str, priority: int) -> bool:
        """Set a waiting ``job``'s priority, and take a round (its new place is known on return);
        whether it was waiting."""
        with self._lock:
            w = self._waiting.get(job)
            if w is None:
                return False
            self._waiting[job] = Waiting(w.job, w.user, w.request, w.seq, priority)
        self._round()
        return True

    def ended(self, job: str, run_id: str | None) -> None:
        """``job`` ended (or failed, was stopped, lost): free its hosts as its processes go."""
        with self._lock:
            self._waiting.pop(job, None)
            held = self.holdings.get(job)
            if held is None:
                return
            hosts = set(held.placement.hosts) - self._leaving.get(job, set())
            self._leaving.setdefault(job, set()).update(hosts)
        for host in sorted(hosts):
            self._workers.submit(self._free, job, run_id, host)

    def rerun(self, job: str, run_id: str, then: Callable[[str], object]) -> None:
        """Run ``job`` again where it is (its holdings kept): ``then(job)`` once nothing of its
        run ``run_id`` is left on any of its hosts (a restart keeps its place and its GPUs)."""

        def gone() -> None:
            held = self.holdings.get(job)
            for host in sorted(set(held.placement.hosts) if held is not None else ()):
                self._wait_gone(job, run_id, host)
            then(job)

        self._workers.submit(gone)

    def requeue(self, job: Waiting, run_id: str | None) -> None:
        """Free ``job``'s hosts as its run ``run_id`` leaves them, then queue it again (a restart after
        a host was lost; its ``seq`` keeps its place)."""
        with self._lock:
            if job.job not in self.holdings:
                self._waiting[job.job] = job
                self._wake.set()
                return
            self._requeue[job.job] = job
        self.ended(job.job, run_id)

    def wait_of(self, job: str) -> Wait | None:
        """``job``'s place in the queue and reason, as the last round left it (None: not waiting)."""
        with self._lock:
            if job not in self._waiting:
                return None
            return self._last.wait_of(job) or Wait(job, len(self._waiting), "waiting for the next round")

    def slots_of(self, placement: Placement) -> str:
        """The value of the job's ``TLAUNCH_POOL_SLOTS`` (:mod:`tlaunch.runtime.slots`)."""
        out: dict[str, dict[str, str]] = {}
        for slot in placement.slots:
            host = self.state.host(slot.host)
            gpus = host.visible_devices(slot.gpus) if host is not None else ",".join(map(str, slot.gpus))
            out[slot.host] = {"gpus": gpus, "cpus": format_cpus(slot.cpus)}
        return json.dumps(out, sort_keys=True)

    def view(self) -> dict[str, Any]:
        """The pool for ``GET /v1/pool``: every host, what is in use and by which job, the queue."""
        with self._lock:
            hosts = self.state.hosts()
            out_hosts = []
            for h in hosts:
                use = self.holdings.on(h.name)
                busy = h.busy_gpus()
                gpus = [
                    {"index": g.index, "uuid": g.uuid, "name": g.name, "memory_mib": g.memory_mib,
                     "job": use.gpus.get(g.index),
                     "others": [{"pid": p.pid, "name": p.name} for p in busy.get(g.index, ())
                                if g.index not in use.gpus]}
                    for g in h.gpus
                ]  # fmt: skip
                out_hosts.append(
                    {
                        "name": h.name, "pool": h.pool, "up": h.up, "reason": h.reason,
                        "labels": sorted(h.labels), "cpus": len(h.cpus), "cpus_used": len(use.cpus),
                        "memory": h.memory, "memory_used": use.memory, "gpus": gpus,
                        "jobs": sorted(set(use.gpus.values()) | set(use.cpus.values())),
                        "last_answer": self.state.last_answer(h.name),
                    }
                )  # fmt: skip
            queue = [
                {"job": w.job, "position": w.position, "reason": w.reason,
                 "user": self._waiting[w.job].user, "priority": self._waiting[w.job].priority}
                for w in self._last.waits if w.job in self._waiting
            ]  # fmt: skip
            limits = {"gpus": self.config.limits.gpus, "users": dict(self.config.limits.users)}
        return {"pools": list(self.config.pools), "hosts": out_hosts, "queue": queue, "limits": limits}

    # -- threads ----------------------------------------------------------------------------
    def _probe_loop(self) -> None:
        while not self._closed.wait(self.config.probe_every):
            try:
                self.probe()
            except Exception:  # the next probe tries again; the hosts keep their last state
                log.exception("probing the pool")

    def _schedule_loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(5.0)  # and now and then, whatever happened
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self._round()
            except Exception:
                log.exception("scheduling the pool")

    def _round(self) -> None:
        with self._lock:
            hosts = self.state.hosts()
            decided = schedule(hosts, self.holdings, list(self._waiting.values()), self.config.limits)
            by_name = {h.name: h for h in hosts}
            starts = []
            for s in decided.starts:
                try:
                    self.holdings.hold(s.job, s.user, s.placement, time.time())
                except HoldingConflict:  # never: schedule places on what is free; said if it did
                    log.exception("job %s was placed on what another job holds; it waits", s.job)
                    continue
                del self._waiting[s.job]
                self.journal.write("hold", s.job, s.placement.slots, by_name, user=s.user)
                starts.append(s)
            self._last = decided
        for s in starts:  # outside the lock: the server records the job and launches it
            try:
                self._start(s.job, s.placement)
            except Exception:
                log.exception("starting job %s on its placement; released", s.job)
                self._release(s.job, None, "its start failed")

    def _free(self, job: str, run_id: str | None, host: str) -> None:
        """Release ``job``'s slot on ``host`` once nothing of its run is left there."""
        self._release(job, host, self._wait_gone(job, run_id, host))

    def _wait_gone(self, job: str, run_id: str | None, host: str) -> str:
        """Wait until nothing of ``run_id`` is left on ``host`` (or ``grace`` s, or the host is down); why."""
        deadline = time.monotonic() + self.grace
        why = "ended"
        while run_id is not None:
            current = self.state.host(host)
            if current is None or not current.up:
                why = "ended; its host is down"
                break
            try:
                left, apps = self.prober.after(host, run_id)
            except (SSHError, ValueError) as exc:
                why = f"ended; its host did not answer ({exc})"
                break
            if not left:
                if apps is not None and self.state.seen_gpu_processes(host, apps):
                    log.info("%s: its GPUs' processes changed", host)
                break
            if time.monotonic() > deadline or self._closed.is_set():
                why = f"ended; {len(left)} of its processes still there after {self.grace:.0f} s: {left[:2]}"
                log.warning("job %s on %s: %s", job, host, why)
                break
            time.sleep(self.check_every)
        return why

    def _release(self, job: str, host: str | None, why: str) -> None:
        with self._lock:
            slots = self.holdings.release(job, host)
            done = job not in self.holdings
            if done:
                self._leaving.pop(job, None)
                again = self._requeue.pop(job, None)
                if again is not None:
                    self._waiting[job] = again
            hosts = {h.name: h for h in self.state.hosts()}
            if slots:
                self.journal.write("release", job, slots, hosts, why=why)
        self._wake.set()
        if done and slots and self._released is not None:
            try:
                self._released(job)
            except Exception:
                log.exception("noting that job %s released its hosts", job)
