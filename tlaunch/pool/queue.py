"""The fair queue (pure): which waiting jobs start now, and why the others wait.

One call, :func:`schedule`, takes the pool as it is (hosts, holdings) and the
jobs that wait, and returns a :class:`Round`: the jobs to start with their
placements, and each other job's place in the queue and reason. The caller
holds the placements, then starts the jobs; it calls again whenever something
changed (a job submitted, a job's holdings released, a host up or down).

The order in which waiting jobs are tried::

    priority (an admin's; higher first)
      └── fair share across users: the user who holds the smallest dominant share
          of the pool (the largest of their GPU, CPU and memory fractions, counting
          what this round starts) goes next, earliest job first on a tie
            └── FIFO within a user: their jobs in the order they were submitted

A job whose user would hold more GPUs than their limit waits ("alice holds 4
of her 4 GPUs"), and does not hold up the others. The first job that does not
fit gets a reservation: the resources it will start on (:func:`place_later`:
those that lack the least now); no later job may take them, so backfill (a
smaller job starting ahead of it, on what it does not need) never delays it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tlaunch.pool.holdings import Holdings, free_view
from tlaunch.pool.placement import capacity_view, place, place_later
from tlaunch.pool.reasons import never_fits, waiting_reason
from tlaunch.pool.resources import Host, Placement, Request

__all__ = ["Limits", "Round", "Start", "Wait", "Waiting", "schedule"]


@dataclass(frozen=True)
class Waiting:
    """A job in the queue.

    Attributes:
        job: its name.
        user: who submitted it.
        request: what it asks.
        seq: its place in submission order (its creation time: smaller is older).
        priority: an admin's priority (higher first; default 0).
    """

    job: str
    user: str
    request: Request
    seq: float
    priority: int = 0


@dataclass(frozen=True)
class Limits:
    """Per-user limits: the most GPUs a user's jobs hold at once.

    Attributes:
        gpus: every user's limit (None: none).
        users: a user's own limit, over ``gpus`` (None: none for that user).
    """

    gpus: int | None = None
    users: Mapping[str, int | None] = field(default_factory=dict)

    def gpus_of(self, user: str) -> int | None:
        """``user``'s limit of GPUs at once (None: no limit)."""
        return self.users.get(user, self.gpus)


@dataclass(frozen=True)
class Start:
    """A job to start now, on ``placement`` (hold it first)."""

    job: str
    user: str
    placement: Placement


@dataclass(frozen=True)
class Wait:
    """A job that waits: its place in the queue (1: next) and why."""

    job: str
    position: int
    reason: str


@dataclass(frozen=True)
class Round:
    """What :func:`schedule` decided.

    Attributes:
        starts: the jobs to start, in the order decided.
        waits: the jobs that wait, in queue order.
        reserved: the job the reservation is for, and what is kept for it.
    """

    starts: tuple[Start, ...] = ()
    waits: tuple[Wait, ...] = ()
    reserved: tuple[str, Placement] | None = None

    def wait_of(self, job: str) -> Wait | None:
        """``job``'s wait, if it waits."""
        return next((w for w in self.waits if w.job == job), None)


def schedule(
    hosts: Sequence[Host], holdings: Holdings, waiting: Sequence[Waiting], limits: Limits | None = None
) -> Round:
    """Decide which of ``waiting`` start now and where (see the module docstring); nothing is changed."""
    limits = limits or Limits()
    free = free_view(hosts, holdings)
    open_ = {name: f.copy() for name, f in free.items()}  # free, less what is reserved
    totals = _totals(hosts)
    used = {user: list(t) for user, t in holdings.user_totals().items()}
    starts: list[Start] = []
    waits: list[tuple[Waiting, str | None, str]] = []  # (job, its whole reason, or what follows the pool's)
    reserved: tuple[str, Placement] | None = None
    # What is free only shrinks as the round goes: a shape of request that did not fit
    # will not, and each shape's reasons are the same words (100 jobs are a few shapes).
    unplaced: set[Request] = set()
    fits_free: dict[Request, bool] = {}
    nevers: dict[tuple[Request, int | None], str | None] = {}
    for job in _FairOrder(waiting, used, totals):
        request, user = job.request, job.user
        mine = used.setdefault(user, [0, 0, 0])
        limit = limits.gpus_of(user)
        if (request, limit) not in nevers:
            nevers[request, limit] = never_fits(request, hosts, limit)
        never = nevers[request, limit]
        if never is not None:
            waits.append((job, f"never fits: {never}", ""))
            continue
        if limit is not None and mine[0] + request.total_gpus > limit:
            said = f"{user} holds {mine[0]} of their {limit} GPUs at once"
            waits.append((job, f"waiting for {request.total_gpus} GPUs: {said}", ""))
            continue
        placement = None if request in unplaced else place(request, open_)
        if placement is not None:
            for slot in placement.slots:
                open_[slot.host].take(slot)
                free[slot.host].take(slot)
            fits_free.clear()
            mine[0] += request.total_gpus
            mine[1] += request.trainers * request.cpus
            mine[2] += request.trainers * request.memory
            starts.append(Start(job.job, user, placement))
            continue
        unplaced.add(request)
        then = ""
        if reserved is None:
            kept = place_later(request, capacity_view(hosts, holdings), free)
            if kept is not None:
                reserved = (job.job, kept)
                for slot in kept.slots:
                    open_[slot.host].take(slot)
                then = f"; next to start, on {', '.join(dict.fromkeys(kept.hosts))}"
        else:
            if request not in fits_free:
                fits_free[request] = place(request, free) is not None
            if fits_free[request]:
                then = f"; what is free is kept for {reserved[0]}, ahead in the queue"
        waits.append((job, None, then))
    reasons: dict[Request, str] = {}
    for w, whole, _ in waits:  # the pool's part said as the round leaves it, after its starts
        if whole is None and w.request not in reasons:
            reasons[w.request] = waiting_reason(w.request, free)
    out = tuple(
        Wait(w.job, i, whole if whole is not None else reasons[w.request] + then)
        for i, (w, whole, then) in enumerate(waits, 1)
    )
    return Round(tuple(starts), out, reserved)


def _totals(hosts: Sequence[Host]) -> tuple[int, int, int]:
    up = [h for h in hosts if h.up and h.known]
    return (sum(len(h.gpus) for h in up), sum(len(h.cpus) for h in up), sum(h.memory for h in up))


def _share(used: Sequence[int], totals: tuple[int, int, int]) -> float:
    """The dominant share: the largest fraction of a resource of the pool that ``used`` is."""
    return max((u / t for u, t in zip(used, totals, strict=True) if t), default=0.0)


class _FairOrder:
    """``waiting`` in the order they are tried (see the module docstring), lazily.

    Each user's share is read from ``used`` when the user is queued again, after
    the caller has counted the job it just placed (``used`` is the caller's).
    """

    def __init__(
        self, waiting: Sequence[Waiting], used: Mapping[str, list[int]], totals: tuple[int, int, int]
    ) -> None:
        self.used, self.totals, self.waiting = used, totals, waiting
        self.levels = deque(sorted({w.priority for w in waiting}, reverse=True))
        self.queues: dict[str, deque[Waiting]] = {}
        self.heap: list[tuple[float, float, str]] = []
        self.last: str | None = None

    def __iter__(self) -> _FairOrder:
        return self

    def _push(self, user: str) -> None:
        share = _share(self.used.get(user, [0, 0, 0]), self.totals)
        heapq.heappush(self.heap, (share, self.queues[user][0].seq, user))

    def __next__(self) -> Waiting:
        if self.last is not None and self.queues[self.last]:
            self._push(self.last)  # with what the caller placed for it since
        self.last = None
        while not self.heap:
            if not self.levels:
                raise StopIteration
            level = self.levels.popleft()
            self.queues = {}
            for w in sorted((w for w in self.waiting if w.priority == level), key=lambda w: (w.seq, w.job)):
                self.queues.setdefault(w.user, deque()).append(w)
            for user in self.queues:
                self._push(user)
        _, _, user = heapq.heappop(self.heap)
        self.last = user
        return self.queues[user].popleft()
