"""Which job holds what, host by host; and what is free (pure).

The invariant: a GPU or a CPU of a host is held by at most one job.
:meth:`Holdings.hold` checks it for the whole placement before it changes
anything (:class:`~tlaunch.pool.errors.HoldingConflict` otherwise), so a job
is held whole or not at all. A job's slots are released host by host (its
last process on a host is gone) or all at once; the job is forgotten with its
last slot.

:func:`free_view` is what the scheduler places on: each up host's GPUs, CPUs
and memory that no job holds, less the GPUs someone else's process uses (seen
by the host's last probe: a GPU with a process that no job of ours holds is
never handed out).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tlaunch.pool.errors import HoldingConflict
from tlaunch.pool.resources import GpuProcess, Host, Placement, Slot

__all__ = ["Free", "Held", "HostUse", "Holdings", "free_view"]


@dataclass(frozen=True)
class Held:
    """One job's holdings.

    Attributes:
        job: the job's name.
        user: who submitted it (fair share counts what each user holds).
        placement: its slots still held (those of hosts it has left are gone).
        since: when it was held (seconds since the epoch).
    """

    job: str
    user: str
    placement: Placement
    since: float = 0.0


@dataclass
class HostUse:
    """What jobs hold on one host: GPU index -> job, CPU id -> job, bytes."""

    gpus: dict[int, str] = field(default_factory=dict)
    cpus: dict[int, str] = field(default_factory=dict)
    memory: int = 0


class Holdings:
    """What each job holds; a GPU or CPU is never held twice (see the module docstring)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Held] = {}
        self._hosts: dict[str, HostUse] = {}

    def __contains__(self, job: object) -> bool:
        return job in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def jobs(self) -> list[Held]:
        """Every job held, oldest first."""
        return sorted(self._jobs.values(), key=lambda h: (h.since, h.job))

    def get(self, job: str) -> Held | None:
        """What ``job`` holds, if anything."""
        return self._jobs.get(job)

    def on(self, host: str) -> HostUse:
        """What jobs hold on ``host``."""
        return self._hosts.get(host) or HostUse()

    def hold(self, job: str, user: str, placement: Placement, since: float = 0.0) -> None:
        """Hold ``placement`` for ``job``, whole or not at all.

        Raises:
            HoldingConflict: ``job`` holds something already, or a GPU or CPU of the
                placement is another job's (or given twice within it).
        """
        if job in self._jobs:
            raise HoldingConflict(f"job {job!r} already holds {self._jobs[job].placement.to_dict()}")
        taken: set[tuple[str, str, int]] = set()
        for slot in placement.slots:
            use = self.on(slot.host)
            for kind, ids, holders in (("GPU", slot.gpus, use.gpus), ("CPU", slot.cpus, use.cpus)):
                for i in ids:
                    if i in holders or (kind, slot.host, i) in taken:
                        other = holders.get(i, job)
                        raise HoldingConflict(
                            f"{kind} {i} of {slot.host} is held by job {other!r}; job {job!r} cannot have it"
                        )
                    taken.add((kind, slot.host, i))
        for slot in placement.slots:
            use = self._hosts.setdefault(slot.host, HostUse())
            use.gpus.update(dict.fromkeys(slot.gpus, job))
            use.cpus.update(dict.fromkeys(slot.cpus, job))
            use.memory += slot.memory
        self._jobs[job] = Held(job, user, placement, since)

    def release(self, job: str, host: str | None = None) -> tuple[Slot, ...]:
        """Release ``job``'s slots on ``host`` (None: all of them); the slots released."""
        held = self._jobs.get(job)
        if held is None:
            return ()
        gone = tuple(s for s in held.placement.slots if host is None or s.host == host)
        for slot in gone:
            use = self._hosts[slot.host]
            for i in slot.gpus:
                use.gpus.pop(i, None)
            for i in slot.cpus:
                use.cpus.pop(i, None)
            use.memory -= slot.memory
            if not use.gpus and not use.cpus and use.memory <= 0:
                del self._hosts[slot.host]
        left = tuple(s for s in held.placement.slots if s not in gone)
        if left:
            self._jobs[job] = replace(held, placement=Placement(left))
        else:
            del self._jobs[job]
        return gone

    def user_gpus(self) -> dict[str, int]:
        """GPUs each user holds now."""
        out: dict[str, int] = {}
        for held in self._jobs.values():
            out[held.user] = out.get(held.user, 0) + sum(len(s.gpus) for s in held.placement.slots)
        return out

    def user_totals(self) -> dict[str, tuple[int, int, int]]:
        """GPUs, CPUs and bytes each user holds now."""
        out: dict[str, tuple[int, int, int]] = {}
        for held in self._jobs.values():
            g, c, m = out.get(held.user, (0, 0, 0))
            for s in held.placement.slots:
                g, c, m = g + len(s.gpus), c + len(s.cpus), m + s.memory
            out[held.user] = (g, c, m)
        return out


@dataclass
class Free:
    """What is free on one host now (the scheduler's working copy: it takes from it as it places).

    Attributes:
        host: the host.
        gpus: free GPU indices, ascending.
        cpus: free CPU ids, ascending.
        memory: free bytes.
        foreign: GPUs (by index) in use by processes no job holds, and those processes.
    """

    host: Host
    gpus: list[int]
    cpus: list[int]
    memory: int
    foreign: dict[int, tuple[GpuProcess, ...]] = field(default_factory=dict)

    def copy(self) -> Free:
        """A copy to take from."""
        return Free(self.host, list(self.gpus), list(self.cpus), self.memory, dict(self.foreign))

    def take(self, slot: Slot) -> None:
        """Take ``slot``'s resources (those not free are ignored: a reservation's future ones)."""
        gone_g, gone_c = set(slot.gpus), set(slot.cpus)
        self.gpus = [i for i in self.gpus if i not in gone_g]
        self.cpus = [i for i in self.cpus if i not in gone_c]
        self.memory = max(0, self.memory - slot.memory)


def free_view(hosts: Iterable[Host], holdings: Holdings) -> dict[str, Free]:
    """What is free on each host (down or unknown hosts: nothing), by host name."""
    out: dict[str, Free] = {}
    for host in hosts:
        if not host.up or not host.known:
            out[host.name] = Free(host, [], [], 0)
            continue
        use = holdings.on(host.name)
        busy = host.busy_gpus()
        foreign = {i: procs for i, procs in busy.items() if i not in use.gpus}
        gpus = sorted(g.index for g in host.gpus if g.index not in use.gpus and g.index not in foreign)
        cpus = sorted(i for i in host.cpus if i not in use.cpus)
        out[host.name] = Free(host, gpus, cpus, max(0, host.memory - use.memory), foreign)
    return out
