"""DeepSpeed's hostfiles and slot selection, as its runner reads them (pure, but for reading the file).

A hostfile is ``host slots=N`` lines with ``#`` comments; ``--include`` /
``--exclude`` (``host:0,1@host2``), ``--num_nodes`` and ``--num_gpus`` select
slots as DeepSpeed's runner does. Every bad line, host or slot is an error
that names it.
"""

from __future__ import annotations

import collections
import os
import re
from collections.abc import Sequence

from tlaunch.errors import LaunchError
from tlaunch.torch.placement import resolve_hostnames

__all__ = ["MAX_SLOTS", "deepspeed_world", "parse_hostfile", "read_hostfile", "select_slots"]

_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")
MAX_SLOTS = 1024
"""The most slots (ranks) a host of a hostfile may have."""


def parse_hostfile(text: str, source: str = "hostfile") -> collections.OrderedDict[str, int]:
    """DeepSpeed's hostfile as host -> slots, in file order.

    Raises:
        LaunchError: a malformed or duplicate line (named with its number), or no hosts at all.
    """
    hosts: collections.OrderedDict[str, int] = collections.OrderedDict()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise LaunchError(
                f"{source} line {number}: {raw.strip()!r} is not 'HOST slots=N' (e.g. 'worker-1 slots=4')"
            )
        host, slots = m.group(1), int(m.group(2))
        if host in hosts:
            raise LaunchError(f"{source} line {number}: host {host!r} is listed twice; list each host once")
        if not 1 <= slots <= MAX_SLOTS:
            raise LaunchError(
                f"{source} line {number}: {host} has slots={slots}; give 1 to {MAX_SLOTS} "
                "(the GPUs, or ranks, of that host)"
            )
        hosts[host] = slots
    if not hosts:
        raise LaunchError(f"{source} lists no hosts; write one 'HOST slots=N' line per host")
    return hosts


def read_hostfile(path: str) -> collections.OrderedDict[str, int]:
    """The hostfile at ``path`` (see :func:`parse_hostfile`).

    Raises:
        LaunchError: it is missing, a folder, unreadable, not UTF-8 text, or malformed.
    """
    if os.path.isdir(path):
        raise LaunchError(f"hostfile {path!r} is a folder; give the path of a DeepSpeed hostfile in it")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise LaunchError(
            f"hostfile {path!r} does not exist; give the path of a DeepSpeed hostfile"
        ) from None
    except UnicodeDecodeError as exc:
        raise LaunchError(
            f"hostfile {path!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "write it as 'HOST slots=N' lines"
        ) from None
    except OSError as exc:
        raise LaunchError(f"hostfile {path!r} cannot be read: {exc.strerror}") from None
    return parse_hostfile(text, path)


def _parse_filter(text: str, what: str, pool: dict[str, list[int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for part in text.split("@"):
        host, _, slots = part.strip().partition(":")
        if not host:
            raise LaunchError(f"{what}={text!r} has an empty entry; use e.g. 'worker-0:0,1@worker-1'")
        if host not in pool:
            raise LaunchError(
                f"{what}={text!r}: host {host!r} is not in the hostfile; its hosts: {list(pool)}"
            )
        ids: list[int] = []
        for s in filter(None, slots.split(",")):
            if not s.strip().isdigit() or int(s) not in pool[host]:
                raise LaunchError(
                    f"{what}={text!r}: host {host!r} has no slot {s!r}; its slots: {pool[host]}"
                )
            ids.append(int(s))
        out[host] = ids
    return out


def select_slots(
    hosts: collections.OrderedDict[str, int],
    include: str = "",
    exclude: str = "",
    num_nodes: int = -1,
    num_gpus: int = -1,
) -> collections.OrderedDict[str, list[int]]:
    """The slots to use on each host, as DeepSpeed's runner selects them (host order kept).

    Raises:
        LaunchError: both filters, an unknown host or slot, or nothing left.
    """
    if include and exclude:
        raise LaunchError("include and exclude cannot both be given; use one of them")
    pool = {h: list(range(n)) for h, n in hosts.items()}
    if include:
        chosen = _parse_filter(include, "include", pool)
        picked = {h: (ids or pool[h]) for h, ids in chosen.items()}
    else:
        picked = {h: list(ids) for h, ids in pool.items()}
        for h, ids in (_parse_filter(exclude, "exclude", pool) if exclude else {}).items():
            picked[h] = [s for s in picked[h] if ids and s not in ids]
    out = collections.OrderedDict((h, sorted(set(picked[h]))) for h in hosts if picked.get(h))
    if num_nodes > 0:
        out = collections.OrderedDict(list(out.items())[:num_nodes])
    if num_gpus > 0:
        out = collections.OrderedDict((h, ids[:num_gpus]) for h, ids in out.items())
    if not out:
        raise LaunchError("no host and slot is left after include/exclude; loosen the filter")
    return out


def deepspeed_world(
    hostfile: str | None = None,
    hostnames: Sequence[str] | str | None = None,
    include: str = "",
    exclude: str = "",
    num_nodes: int = -1,
    num_gpus: int = -1,
    slots_per_host: int = 1,
) -> collections.OrderedDict[str, list[int]]:
    """The slots of each host a deepspeed job uses (host order kept).

    Without a hostfile, the hosts are ``hostnames`` (default: the SLURM allocation
    inside one, else this machine), each with ``num_gpus`` slots when given (as
    DeepSpeed's runner gives this machine), else ``slots_per_host``.

    Raises:
        LaunchError: a bad hostfile, host list or filter.
    """
    if hostfile is not None:
        pool = read_hostfile(hostfile)
    else:
        slots = num_gpus if num_gpus > 0 else slots_per_host
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            raise LaunchError(f"slots_per_host={slots!r} must be 1 to {MAX_SLOTS}")
        hosts = resolve_hostnames("auto" if hostnames is None else hostnames)
        pool = collections.OrderedDict((h, slots) for h in hosts)
    return select_slots(pool, include, exclude, num_nodes, num_gpus)
