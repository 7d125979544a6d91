"""The one answer to "does this process run inside a SLURM allocation?".

The launcher (should a launch with no launch type go to SLURM?), the SLURM
backend and the torch jobs (``hostnames="slurm"``) all ask it here, from the
environment SLURM gives a job's processes, so they never disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SlurmAllocation", "slurm_allocation"]


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
