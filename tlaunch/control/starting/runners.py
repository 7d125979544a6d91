"""The runner of every launch method: a typed function that runs a job where it is placed.

A runner takes the job (a :class:`~tlaunch.jobs.JobSpec`) and its
:class:`Place` and runs the job until it ends, raising the job's own error
when it fails; it returns what the job returned when its method keeps that
(``Method.keeps_results``), else None. The one entry point of detached jobs
(:mod:`.jobmain`) calls the runner of the job's method, whatever the target::

    target                        the runner's Place
    ────────────────────────────  ──────────────────────────────────────────────────────
    this machine                  hosts ("localhost",)
    SSH hosts                     hosts, ssh_config, working_dir, python (each host's env)
    a SLURM batch job             hosts: the allocation's nodes, allocation=True

:data:`RUNNERS` holds one runner per entry of
:data:`tlaunch.runtime.methods.METHODS` (the table's other half; a test keeps
them equal): the table says what differs between methods, and this says how
each runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tlaunch.control.starting.place import Place
from tlaunch.control.starting.programs import run_function, run_program
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.torch.basic import basic
from tlaunch.torch.deepspeed import deepspeed
from tlaunch.torch.torchrun import torchrun

__all__ = ["RUNNERS", "Place", "Runner", "runner_of"]


Runner = Callable[[JobSpec, Place], Any]
"""Runs a job where it is placed; what the job returned (a method that keeps it) or None.

Raises ``TLaunchError`` (a rank's error, a host lost...) when the job fails."""


def run_basic(job: JobSpec, place: Place) -> None:
    """``basic``: ``num_trainer`` trainers of the script over the hosts (:func:`tlaunch.torch.basic`)."""
    _trainers(job, place, as_command=False)


def run_command(job: JobSpec, place: Place) -> None:
    """``command``: ``num_trainer`` trainers, each running the job's command as it is."""
    _trainers(job, place, as_command=True)


def _trainers(job: JobSpec, place: Place, *, as_command: bool) -> None:
    basic(
        list(job.script),
        job.num_trainer,
        list(place.hosts),
        set_share_file=job.set_share_file,
        env=dict(job.env),
        run_id=place.run_id,
        ssh=place.ssh(),
        as_command=as_command,
        rank_args=job.rank_args,
    )


def run_torchrun(job: JobSpec, place: Place) -> None:
    """``torchrun``: torch's elastic agent on every host (``nnodes`` defaults to every host)."""
    torchrun(
        list(job.script),
        list(place.hosts),
        job.nnodes or str(len(place.hosts)),
        job.nproc_per_node,
        job.max_restarts,
        env=dict(job.env),
        run_id=place.run_id,
        ssh=place.ssh(),
    )


def run_deepspeed(job: JobSpec, place: Place) -> None:
    """``deepspeed``: DeepSpeed's per-node launcher on every host, ``nproc_per_node`` ranks each."""
    deepspeed(
        list(job.script),
        hostnames=list(place.hosts),
        num_gpus=job.nproc_per_node,
        env=dict(job.env),
        run_id=place.run_id,
        ssh=place.ssh(),
    )


RUNNERS: dict[str, Runner] = {
    "basic": run_basic,
    "torchrun": run_torchrun,
    "deepspeed": run_deepspeed,
    "command": run_command,
    "program": run_program,
    "function": run_function,
}
"""The runner of each method of :data:`tlaunch.runtime.methods.METHODS`, by its name."""


def runner_of(method: str) -> Runner:
    """The runner of ``method``.

    Raises:
        LaunchError: no method of that name has a runner here.
    """
    try:
        return RUNNERS[method]
    except KeyError:
        raise LaunchError(f"method {method!r} has no runner; the methods that run: {list(RUNNERS)}") from None
