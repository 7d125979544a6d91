"""Where a torch job runs: which hosts it uses, how many workers each runs, and how they are reached.

``hostnames`` is a list of hosts (``localhost`` needs no SSH; the others are
ssh-config names or ``user@host:port`` as everywhere in tlaunch), ``"slurm"``
(the current SLURM allocation) or ``"auto"`` (the allocation when inside one,
else this machine). SLURM's compressed node lists (``gpu[01-02],cpu7``) are
expanded here, in Python, and checked against ``scontrol show hostnames`` where
that command exists.

The job's program then runs on one of three placements (:class:`Placement`):
this machine (every host is it), steps of the SLURM allocation it runs in
(its hosts are the allocation's nodes), or SSH hosts. Each backend's own
options travel typed (:class:`HostOptions`: ``SSHOptions``, ``SlurmOptions``)
from the entry point (``launch``, ``torchrun``, ``deepspeed``, ``basic``) to
here, where they become the keyword arguments of :func:`tlaunch.launch`, once.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tlaunch.allocation import slurm_allocation
from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.errors import LaunchError
from tlaunch.hosts import parse_host
from tlaunch.nodelist import expand_nodelist

__all__ = [
    "Placed",
    "HostOptions",
    "Placement",
    "WorkersSpec",
    "all_local",
    "allocation_places",
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


def all_local(hosts: Sequence[str]) -> bool:
    """Whether every host is this machine (the job then needs no SSH)."""
    return all(parse_host(h).is_local for h in hosts)


def allocation_places(hosts: Sequence[str]) -> bool:
    """Whether ``hosts`` are nodes of the SLURM allocation this process runs in (outside a step of it)."""
    allocation = slurm_allocation()
    if allocation is None or allocation.in_step:
        return False
    try:
        return set(hosts) <= set(slurm_hostnames())
    except LaunchError:
        return False


@dataclass(frozen=True)
class Placed:
    """Where :func:`tlaunch.launch` runs a torch job's program: its launch type (None: this machine's
    default) and that backend's options (None: its defaults)."""

    launch_type: str | None
    backend_options: SSHOptions | SlurmOptions | None


class Placement(enum.Enum):
    """Where a torch job's program runs."""

    LOCAL = "this machine"
    ALLOCATION = "steps of the SLURM allocation"
    SSH = "SSH hosts"


def _given(options: SSHOptions | SlurmOptions) -> dict[str, Any]:
    """The fields of a backend's options that differ from their defaults."""
    return {
        f.name: getattr(options, f.name)
        for f in dataclasses.fields(options)
        if f.default is dataclasses.MISSING or getattr(options, f.name) != f.default
    }


@dataclass(frozen=True)
class HostOptions:
    """How a torch job reaches its hosts: the typed options of each backend that may place it.

    Attributes:
        ssh: options of SSH hosts (``ssh_config``, ``python``, ``working_dir``,
            ``setup``, ``accept_unknown_hosts``...: :class:`~tlaunch.backends.ssh.SSHOptions`).
            Given, remote hosts are reached over SSH even inside a SLURM allocation.
        slurm: options of the steps of the SLURM allocation this runs in (``python``,
            ``srun_args``: :class:`~tlaunch.backends.slurm.SlurmOptions`), used when
            the job's hosts are the allocation's nodes.
        shared_filesystem: every host sees this machine's files (``working_dir=False``):
            SSH hosts get nothing shipped and start where the launcher is; wherever
            the job is placed, it stays free to run as a SLURM step or here.
        shared_paths: paths every SSH host must see (checked in their preflight).
    """

    ssh: SSHOptions | None = None
    slurm: SlurmOptions | None = None
    shared_filesystem: bool = False
    shared_paths: tuple[str, ...] = ()

    @classmethod
    def given(
        cls,
        ssh: SSHOptions | None = None,
        slurm: SlurmOptions | None = None,
        ssh_config_file: str | None = None,
        working_dir: str | Literal[False] | None = None,
    ) -> HostOptions:
        """The options of an entry point's arguments (``ssh_config_file`` and ``working_dir`` go to ``ssh``).

        ``working_dir=False`` (a shared filesystem) is kept apart, so that it does not
        make the job's hosts SSH hosts by itself.

        Raises:
            LaunchError: ``ssh`` or ``slurm`` is not the backend's options class.
        """
        for name, value, kind in (("ssh", ssh, SSHOptions), ("slurm", slurm, SlurmOptions)):
            if value is not None and not isinstance(value, kind):
                raise LaunchError(f"{name}={value!r} must be a {kind.__name__}(...) (or None)")
        if working_dir is False:
            return cls(cls.given(ssh, slurm, ssh_config_file).ssh, slurm, shared_filesystem=True)
        if ssh_config_file is not None or working_dir is not None:
            base = ssh or SSHOptions()
            ssh = dataclasses.replace(
                base,
                ssh_config=base.ssh_config if ssh_config_file is None else ssh_config_file,
                working_dir=base.working_dir if working_dir is None else working_dir,
            )
        return cls(ssh, slurm)

    def placement(self, hosts: Sequence[str]) -> Placement:
        """Where a job on ``hosts`` runs with these options."""
        if all_local(hosts):
            return Placement.LOCAL
        if self.ssh is None and allocation_places(hosts):
            return Placement.ALLOCATION
        return Placement.SSH

    @property
    def shares_filesystem(self) -> bool:
        """Whether every host sees this machine's files (nothing is shipped)."""
        return self.shared_filesystem or (self.ssh is not None and self.ssh.working_dir is False)

    def with_shared_path(self, path: str) -> HostOptions:
        """These options, with ``path`` one that every SSH host must see."""
        return dataclasses.replace(self, shared_paths=(*self.shared_paths, path))

    def with_working_dir(self, working_dir: str) -> HostOptions:
        """These options, with ``working_dir`` shipped to SSH hosts."""
        return dataclasses.replace(
            self, ssh=dataclasses.replace(self.ssh or SSHOptions(), working_dir=working_dir)
        )

    def placed(self, hosts: Sequence[str]) -> Placed:
        """How :func:`tlaunch.launch` places a program on ``hosts``: its launch type and backend options.

        Raises:
            LaunchError: options of a backend that does not place these hosts.
        """
        where = self.placement(hosts)
        ssh = _given(self.ssh) if self.ssh is not None else {}
        ssh.pop("ssh_config", None)  # harmless where there is no SSH
        if where is Placement.LOCAL and (ssh or self.slurm is not None):
            given = sorted(ssh) + (["slurm"] if self.slurm is not None else [])
            raise LaunchError(
                f"{given} are options of remote hosts, but every host of {list(hosts)} is this machine; "
                "drop them (start in the folder the job needs)"
            )
        if where is not Placement.ALLOCATION and self.slurm is not None:
            raise LaunchError(
                f"slurm={self.slurm!r} applies to the nodes of the SLURM allocation this runs in, but "
                f"{list(hosts)} are {where.value}; drop it"
            )
        if where is Placement.ALLOCATION:
            return Placed("slurm", self.slurm or SlurmOptions())
        if where is Placement.SSH:
            options = self.ssh or SSHOptions()
            if self.shares_filesystem:
                shared = (*options.shared_paths, *self.shared_paths)
                options = dataclasses.replace(options, working_dir=False, shared_paths=shared)
            return Placed("ssh", options)
        return Placed(None, None)
