"""Where a job runs, as its runner sees it: :class:`Place`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.hosts import parse_host

__all__ = ["Place"]


@dataclass(frozen=True)
class Place:
    """Where a job runs, as its runner sees it.

    Attributes:
        hosts: the job's hosts, the first rank 0's (``localhost``: this machine; in a SLURM
            batch job, the allocation's nodes).
        allocation: the hosts are the nodes of the SLURM allocation this runs in (each node's
            processes are steps of it).
        ssh_config: the ssh config SSH hosts are read from.
        working_dir: a folder shipped to every SSH host (its processes start in it).
        python: each SSH host's interpreter (its runtime environment's), by host.
        run_id: the run's id (chosen by the submitter; None: one is made).
        started_in: the folder the job's entry point started in (the submitter's, a batch
            job's submit folder), before it moved to a working dir: a job's
            ``./tlaunch-models`` is there (None: the current folder).
    """

    hosts: tuple[str, ...] = ("localhost",)
    allocation: bool = False
    ssh_config: str | None = None
    working_dir: str | None = None
    python: Mapping[str, str] = field(default_factory=dict)
    run_id: str | None = None
    started_in: str | None = None

    @property
    def local(self) -> bool:
        """Whether every host is this machine."""
        return all(parse_host(h).is_local for h in self.hosts)

    def ssh(self) -> SSHOptions | None:
        """The options of SSH hosts this place says (None: nothing to say, or the allocation's nodes)."""
        if self.allocation or not (self.ssh_config or self.working_dir or self.python):
            return None
        return SSHOptions(
            ssh_config=self.ssh_config, working_dir=self.working_dir, python=dict(self.python) or None
        )
