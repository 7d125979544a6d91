"""The one answer to "does this process run inside a SLURM allocation?".

The launcher (should a launch with no launch type go to SLURM?), the SLURM
backend and the torch jobs (``hostnames="slurm"``) all ask it here, from the
environment SLURM gives a job's processes, so they never disagree.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from tlaunch.errors import LaunchError

__all__ = ["LAUNCH_NODE", "SlurmAllocation", "address_towards", "launch_node_address", "slurm_allocation"]

LAUNCH_NODE = "slurm-launch-node"
"""A host name that stands, in what a SLURM step is given, for the machine that launched it:
the step finds its address in ``$SLURM_LAUNCH_NODE_IPADDR`` (:func:`launch_node_address`)."""


@dataclass(frozen=True)
class SlurmAllocation:
    """The SLURM allocation this process runs in, as its environment describes it.

    Attributes:
        job_id: the allocation's job id (``$SLURM_JOB_ID``; empty if SLURM did not set it).
        nodelist: its nodes in SLURM's compressed form (``$SLURM_JOB_NODELIST``).
        step_id: the job step this process belongs to (``$SLURM_STEP_ID``), if any:
            a process of ``srun`` runs in a step, the batch script or an ``salloc``
            shell does not.
    """

    job_id: str
    nodelist: str
    step_id: str | None = None

    @property
    def in_step(self) -> bool:
        """Whether this process belongs to a job step (``srun``), not to the allocation's own shell."""
        return bool(self.step_id)


def slurm_allocation(environ: Mapping[str, str] | None = None) -> SlurmAllocation | None:
    """The allocation this process runs in, or None outside SLURM.

    An allocation is known by its node list (``$SLURM_JOB_NODELIST``, or the
    older ``$SLURM_NODELIST``); without one there is nothing to place nodes on.
    """
    env = os.environ if environ is None else environ
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    return SlurmAllocation(env.get("SLURM_JOB_ID", ""), nodelist, env.get("SLURM_STEP_ID") or None)


def launch_node_address(environ: Mapping[str, str] | None = None) -> str:
    """The address by which this SLURM step reaches the machine that launched it.

    It is ``$SLURM_LAUNCH_NODE_IPADDR``, which ``slurmstepd`` sets in every step
    to the address the launch request came from (``srun``'s machine, as this
    node sees it), so nobody has to ask ``scontrol`` for it.

    Raises:
        LaunchError: this process is no SLURM step (the variable is unset).
    """
    env = os.environ if environ is None else environ
    address = env.get("SLURM_LAUNCH_NODE_IPADDR", "")
    if not address:
        raise LaunchError(
            "this node was given its launcher's address as SLURM's launch node, and "
            "$SLURM_LAUNCH_NODE_IPADDR is unset: it must run as a step of `srun`"
        )
    return address


def address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (how a server here is reached from there)."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise LaunchError(
            f"cannot resolve {host!r} to find this machine's address on the route to it: {exc}"
        ) from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)  # no packet is sent: the kernel only picks the route
        return str(s.getsockname()[0])
