"""Where a job's trainers go (pure): all of them at once, or none.

Each trainer gets a host of its own (a torchrun node, a basic trainer: one
per host) with all its GPUs on that host. Hosts are chosen best-fit: the one
the trainer leaves the least free on (GPUs, then CPUs, then memory) first, so
a partly used host fills before a free one is broken into and whole hosts stay
whole for the large jobs; the job's other trainers spread over the next hosts.
On a host, a trainer's GPUs (and CPUs) are a contiguous run of indices when one
is free: the smallest free run that fits, from its lowest index (so a torch
job's local ranks get neighbouring GPUs, in order); otherwise the lowest free.

:func:`place` places on what is free now. :func:`place_later` places on
what will be free once the running jobs end, preferring what is free now: the
resources kept for the first job that waits (the scheduler's reservation,
which a smaller job may not take: backfill never delays it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate

from tlaunch.pool.holdings import Free, Holdings
from tlaunch.pool.resources import Host, Placement, Request, Slot

__all__ = ["capacity_view", "fits", "pick", "place", "place_later"]


def fits(request: Request, free: Free) -> bool:
    """Whether one trainer of ``request`` fits in ``free`` (an up host it may use)."""
    host = free.host
    return (
        host.up
        and host.known
        and request.eligible(host)
        and len(free.gpus) >= request.gpus
        and len(free.cpus) >= request.cpus
        and free.memory >= request.memory
    )


def place(request: Request, free: Mapping[str, Free]) -> Placement | None:
    """``request``'s placement on what is ``free`` now, or None if not all its trainers fit."""
    fitting = [f for f in free.values() if fits(request, f)]
    if len(fitting) < request.trainers:
        return None
    fitting.sort(
        key=lambda f: (
            len(f.gpus) - request.gpus,
            len(f.cpus) - request.cpus,
            f.memory - request.memory,
            f.host.name,
        )
    )
    return Placement(tuple(_slot(request, f) for f in fitting[: request.trainers]))


def place_later(request: Request, later: Mapping[str, Free], now: Mapping[str, Free]) -> Placement | None:
    """``request``'s placement once the running jobs end (``later``), using what is free ``now`` first.

    The hosts chosen are those that lack the least now, so the job waits for as
    few jobs as can be; on them, the GPUs and CPUs free now come first.
    """
    fitting = [f for f in later.values() if fits(request, f)]
    if len(fitting) < request.trainers:
        return None

    def lack(f: Free) -> tuple[int, int, int, int, str]:
        n = now.get(f.host.name)
        free_g, free_c, free_m = (len(n.gpus), len(n.cpus), n.memory) if n is not None else (0, 0, 0)
        return (
            max(0, request.gpus - free_g),
            max(0, request.cpus - free_c),
            max(0, request.memory - free_m),
            len(f.gpus) - request.gpus,
            f.host.name,
        )

    fitting.sort(key=lack)
    slots = []
    for f in fitting[: request.trainers]:
        n = now.get(f.host.name)
        slots.append(_slot(request, f, n))
    return Placement(tuple(slots))


def _slot(request: Request, free: Free, prefer: Free | None = None) -> Slot:
    return Slot(
        free.host.name,
        pick(free.gpus, request.gpus, None if prefer is None else prefer.gpus),
        pick(free.cpus, request.cpus, None if prefer is None else prefer.cpus),
        request.memory,
    )


def pick(available: Sequence[int], k: int, prefer: Iterable[int] | None = None) -> tuple[int, ...]:
    """``k`` of the ``available`` ids (ascending): a contiguous run when one fits (see the module docstring).

    With ``prefer``, the window of ``k`` contiguous ids holding the most preferred
    ones is taken (then the smallest run, then the lowest id); with no run long
    enough, the preferred ids first, then the lowest.
    """
    if k <= 0:
        return ()
    runs = _runs(available)
    fitting = [r for r in runs if len(r) >= k]
    liked = set(prefer) if prefer is not None else None
    if fitting:
        if liked is None:
            best = min(fitting, key=len)  # the first of the smallest runs: the lowest ids among them
            return tuple(best[:k])
        choice: tuple[int, int, int] | None = None  # (-preferred, run length, first id)
        chosen: tuple[int, ...] = ()
        for run in fitting:
            counts = [0, *accumulate(1 if i in liked else 0 for i in run)]
            for start in range(len(run) - k + 1):
                key = (-(counts[start + k] - counts[start]), len(run), run[start])
                if choice is None or key < choice:
                    choice, chosen = key, tuple(run[start : start + k])
        return chosen
    ordered = sorted(available, key=lambda i: (liked is not None and i not in liked, i))
    return tuple(sorted(ordered[:k]))


def _runs(ids: Sequence[int]) -> list[list[int]]:
    """``ids`` (ascending) as runs of consecutive ids."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def capacity_view(hosts: Iterable[Host], holdings: Holdings) -> dict[str, Free]:
    """What each up host will have once every job of ours has left it: all but others' GPUs."""
    out: dict[str, Free] = {}
    for host in hosts:
        if not host.up or not host.known:
            out[host.name] = Free(host, [], [], 0)
            continue
        held = holdings.on(host.name).gpus
        foreign = {i: p for i, p in host.busy_gpus().items() if i not in held}
        gpus = sorted(g.index for g in host.gpus if g.index not in foreign)
        out[host.name] = Free(host, gpus, sorted(host.cpus), host.memory, foreign)
    return out
