"""SLURM: run a program in an allocation (each node a step), or submit it as a batch job.

``launch(program, launch_type="slurm")`` inside ``salloc`` or an ``sbatch``
script runs each node as an ``srun`` step of the allocation
(:mod:`tlaunch.backends.slurm.backend`); with ``submit=True`` and resources
(``nodes=2, partition=..., time=...``) it submits the program as a batch job
and returns its :class:`SlurmJob` (:mod:`tlaunch.backends.slurm.batch`,
:mod:`tlaunch.backends.slurm.job`).

Its options (:class:`SlurmOptions`) import without the backend itself:
``tlaunch.torch`` names them on every rank and agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.lazy import lazy_exports

if TYPE_CHECKING:
    from tlaunch.backends.slurm.backend import SlurmBackend
    from tlaunch.backends.slurm.commands import JobState
    from tlaunch.backends.slurm.job import SlurmJob

__all__ = ["JobState", "SlurmBackend", "SlurmJob", "SlurmOptions"]

_LAZY = {
    "JobState": "tlaunch.backends.slurm.commands",
    "SlurmBackend": "tlaunch.backends.slurm.backend",
    "SlurmJob": "tlaunch.backends.slurm.job",
}

__getattr__ = lazy_exports(__name__, _LAZY)
