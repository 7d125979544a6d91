"""The options of SLURM launches (keyword arguments of :func:`tlaunch.launch`, ``launch_type="slurm"``)."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields

from tlaunch.backends.base import BackendOptions
from tlaunch.errors import LaunchError

__all__ = ["RESOURCE_OPTIONS", "SlurmOptions", "job_name_of"]

_TIME = re.compile(
    r"^(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$"
)
_MEM = re.compile(r"^\d+[KMGT]?$")
_GPUS = re.compile(r"^(?:[A-Za-z0-9_.-]+:)?\d+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # a newline would end an #SBATCH line and start a shell line
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.+-]+")


def job_name_of(program_name: str) -> str:
    """A SLURM job name made from a program's name: spaces and symbols become ``_`` (at most 64 chars)."""
    return _UNSAFE_NAME.sub("_", program_name).strip("_")[:64] or "tlaunch"


RESOURCE_OPTIONS = (
    "nodes",
    "ntasks_per_node",
    "cpus_per_task",
    "mem",
    "gpus_per_node",
    "partition",
    "account",
    "qos",
    "time",
    "nodelist",
    "job_name",
    "sbatch_args",
)
"""Options that describe the batch job to submit (``submit=True`` only)."""


@dataclass(frozen=True)
class SlurmOptions(BackendOptions):
    """Options of SLURM launches, beside the common ones (:class:`~tlaunch.options.LaunchOptions`).

    Inside an allocation (``salloc``, an ``sbatch`` script) each node runs as a
    step of it. Outside one, ``submit=True`` submits the program as a batch job
    described by the resource options, and ``launch`` returns a
    :class:`~tlaunch.backends.slurm.SlurmJob` at once.

    Attributes:
        job_id: the allocation to run in (default: ``$SLURM_JOB_ID``).
        python: the interpreter on the nodes (default: the launcher's path).
        srun_args: more ``srun`` options for every node's step, as a list
            (``["--cpus-per-task=4"]``).
        submit: submit the program as a batch job (``sbatch``) instead of running
            it in the current allocation.
        nodes: the job's node count (``--nodes``; default 1).
        ntasks_per_node: ``--ntasks-per-node``.
        cpus_per_task: ``--cpus-per-task``.
        mem: memory per node (``--mem``: ``"4G"``, ``"500M"``).
        gpus_per_node: ``--gpus-per-node`` (``2`` or ``"a100:2"``).
        partition: ``--partition`` (default: the cluster's default partition).
        account: ``--account``.
        qos: ``--qos``.
        time: the time limit (``--time``: ``"30"``, ``"1:00:00"``, ``"2-00:00:00"``).
        nodelist: the nodes to run on (``--nodelist``, e.g. ``"n[1-2]"``).
        job_name: ``--job-name`` (default: the program's name).
        sbatch_args: more ``sbatch`` options, as a list (``["--exclusive"]``).
    """

    job_id: str | None = None
    python: str | None = None
    srun_args: Sequence[str] = ()
    submit: bool = False
    nodes: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    gpus_per_node: int | str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    nodelist: str | None = None
    job_name: str | None = None
    sbatch_args: Sequence[str] = ()

    def check(self) -> None:
        for name in ("srun_args", "sbatch_args"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise LaunchError(
                    f"{name}={value!r} must be a list of options, one item each "
                    f"(e.g. {name}=['--exclusive', '--constraint=a100']), not a string"
                )
        for name in ("srun_args", "sbatch_args"):
            for arg in getattr(self, name):
                if not arg.startswith("-") or _CONTROL.search(arg):
                    raise LaunchError(
                        f"{name} item {arg!r} must be one option starting with '-' (e.g. '--exclusive'), "
                        "on one line: it becomes a line of the batch script"
                    )
        given = [f.name for f in fields(self) if f.name in RESOURCE_OPTIONS and getattr(self, f.name)]
        if given and not self.submit:
            raise LaunchError(
                f"{given} describe a batch job to submit: pass submit=True with them; inside an "
                "allocation the nodes are the allocation's (use srun_args for per-step options)"
            )
        for name in ("nodes", "ntasks_per_node", "cpus_per_task"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise LaunchError(f"{name}={value!r} must be a whole number >= 1")
        if self.mem is not None and not _MEM.match(str(self.mem)):
            raise LaunchError(
                f"mem={self.mem!r} is not a SLURM memory size; write e.g. '4G', '500M' or '4000'"
            )
        if self.time is not None and not _TIME.match(str(self.time)):
            raise LaunchError(
                f"time={self.time!r} is not a SLURM time limit; write minutes ('30'), 'HH:MM:SS' "
                "('1:30:00') or 'D-HH:MM:SS' ('2-00:00:00')"
            )
        if self.gpus_per_node is not None and not _GPUS.match(str(self.gpus_per_node)):
            raise LaunchError(
                f"gpus_per_node={self.gpus_per_node!r} must be a count (2) or 'type:count' ('a100:2')"
            )
        for name in ("partition", "account", "qos", "job_name", "job_id", "nodelist"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, str) or not value or any(c.isspace() for c in value)
            ):
                raise LaunchError(f"{name}={value!r} must be a name without spaces")

    @property
    def interpreter(self) -> str:
        """The Python on the nodes."""
        return self.python or sys.executable
