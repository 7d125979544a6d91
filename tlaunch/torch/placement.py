"""Where a torch job runs: which hosts it uses, and how many workers each runs.

``hostnames`` is a list of hosts (``localhost`` needs no SSH; the others are
ssh-config names or ``user@host:port`` as everywhere in tlaunch), ``"slurm"``
(the current SLURM allocation) or ``"auto"`` (the allocation when inside one,
else this machine). SLURM's compressed node lists (``gpu[01-02],cpu7``) are
expanded here, in Python, and checked against ``scontrol show hostnames`` where
that command exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from tlaunch.allocation import slurm_allocation
from tlaunch.errors import LaunchError
from tlaunch.nodelist import expand_nodelist

__all__ = [
    "WorkersSpec",
    "check_workers",
    "resolve_hostnames",
    "slurm_hostnames",
    "slurm_workers",
]

WorkersSpec = int | Sequence[int] | str
"""Workers per host: an int for every host, one int per host, or ``cpu``, ``gpu``, ``auto``, ``slurm``."""

_WORKER_WORDS = ("cpu", "gpu", "auto", "slurm")


def slurm_hostnames(environ: Mapping[str, str] | None = None) -> list[str]:
    """The hosts of the current SLURM allocation, in its order.

    Raises:
        LaunchError: not inside an allocation, or ``scontrol`` disagrees with the parse.
    """
    env = os.environ if environ is None else environ
    allocation = slurm_allocation(env)
    if allocation is None:
        raise LaunchError(
            "hostnames='slurm' needs a SLURM allocation, but SLURM_JOB_NODELIST is not set; "
            "run inside salloc/sbatch, or pass the hosts as a list"
        )
    nodelist = allocation.nodelist
    hosts = expand_nodelist(nodelist)
    scontrol = shutil.which("scontrol")
    if scontrol:
        try:
            out = subprocess.run(
                [scontrol, "show", "hostnames", nodelist],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            out = None
        if out is not None and out.returncode == 0 and out.stdout.split() != hosts:
            raise LaunchError(
                f"SLURM node list {nodelist!r}: tlaunch read {hosts} but "
                f"'scontrol show hostnames' says {out.stdout.split()}; please report this"
            )
    return hosts


def resolve_hostnames(hostnames: Sequence[str] | str) -> list[str]:
    """The hosts of ``hostnames`` (a list, ``"slurm"`` or ``"auto"``).

    Raises:
        LaunchError: an empty list, a repeated host, or ``"slurm"`` outside an allocation.
    """
    if isinstance(hostnames, str):
        if hostnames == "slurm":
            return slurm_hostnames()
        if hostnames == "auto":
            return slurm_hostnames() if slurm_allocation() is not None else ["localhost"]
        raise LaunchError(
            f"hostnames={hostnames!r}: give a list of hosts (e.g. ['node1', 'node2']), "
            "'slurm' (the current allocation) or 'auto'"
        )
    hosts = list(hostnames)
    if not hosts:
        raise LaunchError("hostnames is empty; give at least one host, e.g. ['localhost']")
    bad = [h for h in hosts if not isinstance(h, str) or not h.strip()]
    if bad:
        raise LaunchError(f"hostnames has entries that are not host names: {bad!r}")
    seen: set[str] = set()
    for h in hosts:
        if h in seen:
            raise LaunchError(
                f"host {h!r} appears twice in hostnames; list each host once and give it more "
                "workers with workers_per_host"
            )
        seen.add(h)
    return hosts


def _per_node(value: str) -> list[int]:
    """SLURM's per-node counts (``2(x3),4`` -> [2, 2, 2, 4])."""
    out: list[int] = []
    for part in value.split(","):
        m = re.match(r"^\s*(\d+)(?:\(x(\d+)\))?\s*$", part)
        if not m:
            raise LaunchError(f"cannot read SLURM's per-node count {value!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def slurm_workers(n_hosts: int, environ: Mapping[str, str] | None = None) -> list[int]:
    """Workers per node of the current allocation: its GPUs per node if it has GPUs, else its CPUs.

    Raises:
        LaunchError: not inside an allocation, or counts that do not match the hosts.
    """
    env = os.environ if environ is None else environ
    if slurm_allocation(env) is None:
        raise LaunchError(
            "workers_per_host='slurm' needs a SLURM allocation, but SLURM_JOB_NODELIST is not set; "
            "give a number of workers, or 'gpu'/'cpu'/'auto'"
        )
    gpus = env.get("SLURM_GPUS_PER_NODE") or env.get("SLURM_GPUS_ON_NODE")
    if gpus:
        count = int(gpus.rsplit(":", 1)[-1].split("(")[0])  # "1", "gpu:2", "tesla:4"
        return [count] * n_hosts
    cpus = env.get("SLURM_JOB_CPUS_PER_NODE")
    if not cpus:
        raise LaunchError("the allocation does not say its CPUs per node (SLURM_JOB_CPUS_PER_NODE)")
    counts = _per_node(cpus)
    if len(counts) != n_hosts:
        raise LaunchError(
            f"SLURM_JOB_CPUS_PER_NODE={cpus!r} names {len(counts)} nodes, but there are {n_hosts} hosts"
        )
    return counts


def check_workers(workers_per_host: WorkersSpec, n_hosts: int) -> list[int | str]:
    """``workers_per_host`` as one entry per host: an int > 0, or a word resolved on the host.

    ``"slurm"`` takes the allocation's GPUs per node (else its CPUs per node).

    Raises:
        LaunchError: a count < 1, a list of the wrong length, an unknown word, or
            ``"slurm"`` outside an allocation.
    """
    if isinstance(workers_per_host, str):
        if workers_per_host not in _WORKER_WORDS:
            raise LaunchError(
                f"workers_per_host={workers_per_host!r} is not an int, a list of ints, or one of "
                f"{list(_WORKER_WORDS)}"
            )
        if workers_per_host == "slurm":
            return list(slurm_workers(n_hosts))
        return [workers_per_host] * n_hosts
    if isinstance(workers_per_host, bool):
        raise LaunchError(f"workers_per_host={workers_per_host!r} must be an int, not a bool")
    counts = [workers_per_host] * n_hosts if isinstance(workers_per_host, int) else list(workers_per_host)
    if len(counts) != n_hosts:
        raise LaunchError(
            f"workers_per_host has {len(counts)} entries for {n_hosts} hosts; give one per host, or one int"
        )
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise LaunchError(f"workers_per_host entry {c!r} must be an int >= 1")
    return list(counts)
