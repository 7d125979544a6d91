"""Why a job waits, and why it never could run: the words users read (pure).

- :func:`waiting_reason`: ``waiting for 4 GPUs: 2 free on gpu1, 0 on gpu2`` (the
  resources it lacks, host by host, down hosts with their reason);
- :func:`never_fits`: what a job asks that no state of the pool could give
  (the server's 400 at submission): more than any host has, more hosts than
  there are, a label no host carries, more GPUs than its user may hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tlaunch.pool.holdings import Free
from tlaunch.pool.resources import Host, Request, format_memory

__all__ = ["host_summary", "never_fits", "waiting_reason"]

_SHOWN = 8  # hosts named in a reason; the rest are counted


def host_summary(host: Host) -> str:
    """``th1 (2 GPUs, 2 CPUs, 7.6Gi)``."""
    return f"{host.name} ({_plural(len(host.gpus), 'GPU')}, {_plural(len(host.cpus), 'CPU')}, " + (
        f"{format_memory(host.memory)})"
    )


def never_fits(request: Request, hosts: Sequence[Host], gpu_limit: int | None = None) -> str | None:
    """Why ``request`` could never be placed on ``hosts`` (known ones, up or down), or None if it could.

    ``gpu_limit``: the most GPUs its user may hold at once (None: no limit).
    """
    asked = f"the job asks for {request.describe()}"
    if gpu_limit is not None and request.total_gpus > gpu_limit:
        total = request.total_gpus
        return f"{asked} ({total} GPUs in all), more than its user's limit of {gpu_limit} GPUs at once"
    known = [h for h in hosts if h.known]
    if request.pool is not None and not any(h.pool == request.pool for h in hosts):
        pools = sorted({h.pool for h in hosts})
        return f"{asked} in pool {request.pool!r}, which is not one of the server's pools {pools}"
    in_pool = [h for h in known if request.pool is None or h.pool == request.pool]
    if request.label is not None and not any(h.has_label(request.label) for h in in_pool):
        labels = sorted({x for h in in_pool for x in h.labels})
        models = sorted({g.name for h in in_pool for g in h.gpus if g.name})
        return (
            f"{asked}, but no host has label {request.label!r} (host labels: {labels or 'none'}; "
            f"GPU models: {models or 'none'}); ask for one of them, or label hosts in the pool's file"
        )
    eligible = [h for h in in_pool if request.eligible(h)]
    able = [
        h
        for h in eligible
        if len(h.gpus) >= request.gpus and len(h.cpus) >= request.cpus and h.memory >= request.memory
    ]
    if len(able) >= request.trainers:
        return None
    listing = "; ".join(host_summary(h) for h in eligible[:_SHOWN]) or "no host known yet"
    if len(eligible) > _SHOWN:
        listing += f"; and {len(eligible) - _SHOWN} more"
    if not able:
        most = (
            f"{max((len(h.gpus) for h in eligible), default=0)} GPUs, "
            f"{max((len(h.cpus) for h in eligible), default=0)} CPUs, "
            f"{format_memory(max((h.memory for h in eligible), default=0))}"
        )
        return f"{asked}; no host of the pool has that much (the most on one host: {most}); pool: {listing}"
    return (
        f"{asked}; only {len(able)} host{'' if len(able) == 1 else 's'} of the pool "
        f"({', '.join(h.name for h in able)}) can hold one, and each trainer needs a host of its own; "
        f"the pool: {listing}"
    )


_Dim = tuple[str, Callable[[Free], int], int, Callable[[int], str]]


def waiting_reason(request: Request, free: Mapping[str, Free]) -> str:
    """What ``request`` waits for, host by host: ``waiting for 4 GPUs: 2 free on gpu1, 0 on gpu2``."""
    eligible = [f for f in free.values() if request.eligible(f.host)]
    up = [f for f in eligible if f.host.up and f.host.known]
    dims: list[_Dim] = []
    if request.gpus:
        dims.append(("GPU", lambda f: len(f.gpus), request.gpus, lambda n: _plural(n, "GPU")))
    if request.cpus:
        dims.append(("CPU", lambda f: len(f.cpus), request.cpus, lambda n: _plural(n, "CPU")))
    if request.memory:
        dims.append(("memory", lambda f: f.memory, request.memory, lambda n: f"{format_memory(n)} memory"))
    short = [d for d in dims if sum(1 for f in up if d[1](f) >= d[2]) < request.trainers] or dims
    asked = Request(
        request.trainers,
        request.gpus if any(d[0] == "GPU" for d in short) else 0,
        request.cpus if any(d[0] == "CPU" for d in short) else 0,
        request.memory if any(d[0] == "memory" for d in short) else 0,
        request.label,
    ).describe()
    if request.trainers > 1 and len(up) < request.trainers:
        asked += f" ({len(up)} host{'' if len(up) == 1 else 's'} up)"
    up.sort(key=lambda f: (tuple(-d[1](f) for d in short), f.host.name))
    parts: list[str] = []
    for f in up[:_SHOWN]:
        if len(short) == 1:
            name, amount = short[0][:2]
            text = f"{format_memory(amount(f)) if name == 'memory' else amount(f)}"
            text += f" free on {f.host.name}" if not parts else f" on {f.host.name}"
        else:
            text = f"{f.host.name} has {', '.join(d[3](d[1](f)) for d in short)} free"
        if f.foreign and any(d[0] == "GPU" for d in short):
            text += f" ({_foreign(f)})"
        parts.append(text)
    if len(up) > _SHOWN:
        parts.append(f"{len(up) - _SHOWN} more hosts with less")
    for f in eligible:
        if not f.host.up:
            parts.append(f"{f.host.name} down" + (f" ({f.host.reason})" if f.host.reason else ""))
        elif not f.host.known:
            parts.append(f"{f.host.name} not probed yet")
    return f"waiting for {asked}: {', '.join(parts) or 'no host'}"


def _foreign(f: Free) -> str:
    said = []
    for index, procs in sorted(f.foreign.items()):
        who = ", ".join(f"pid {p.pid} {p.name}".strip() for p in procs[:2])
        said.append(f"GPU {index} used by {who}")
    return "; ".join(said) + ", not a job of this server"


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")
