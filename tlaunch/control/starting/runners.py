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

import dataclasses
import os
import shlex
from collections.abc import Callable
from typing import Any

from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.control.starting.place import Place
from tlaunch.control.starting.programs import run_function, run_program
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.runtime.method_pods import path_arguments
from tlaunch.runtime.records import private_dirs
from tlaunch.torch.basic import basic
from tlaunch.torch.deepspeed import deepspeed
from tlaunch.torch.torchrun import torchrun

__all__ = ["MODELS", "RUNNERS", "Place", "Runner", "runner_of", "with_paths"]

MODELS = "tlaunch-models"
"""The folder of a job's ``--save_path`` and ``--checkpoint_path`` off Kubernetes, in the folder the
job is started from (``/TData/models`` in pods): ``tlaunch-models/<job>``, ``.../last.tar.gz``."""


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
    script, ssh = with_paths(job, place)
    basic(
        script,
        job.num_trainer,
        list(place.hosts),
        set_share_file=job.set_share_file,
        env=dict(job.env),
        run_id=place.run_id,
        ssh=ssh,
        as_command=as_command,
        rank_args=job.rank_args,
    )


def run_torchrun(job: JobSpec, place: Place) -> None:
    """``torchrun``: torch's elastic agent on every host (``nnodes`` defaults to every host)."""
    script, ssh = with_paths(job, place)
    torchrun(
        script,
        list(place.hosts),
        job.nnodes or str(len(place.hosts)),
        job.nproc_per_node,
        job.max_restarts,
        env=dict(job.env),
        run_id=place.run_id,
        ssh=ssh,
    )


def run_deepspeed(job: JobSpec, place: Place) -> None:
    """``deepspeed``: DeepSpeed's per-node launcher on every host, ``nproc_per_node`` ranks each."""
    script, ssh = with_paths(job, place)
    deepspeed(
        script,
        hostnames=list(place.hosts),
        num_gpus=job.nproc_per_node,
        env=dict(job.env),
        run_id=place.run_id,
        ssh=ssh,
    )


def with_paths(job: JobSpec, place: Place) -> tuple[list[str], SSHOptions | None]:
    """The job's script with its ``--save_path`` and ``--checkpoint_path`` (``set_save_path``,
    ``set_checkpoint_path``) after its own arguments, and the options of its SSH hosts.

    They point into ``tlaunch-models/<job>`` of the folder the job started in
    (:data:`MODELS`), which is made before the trainers start, where they run:
    here (this machine, or the SLURM allocation's shared filesystem) or on each
    SSH host (a setup command of the launch). On Kubernetes the pods get
    ``/TData/models/<job>`` (:mod:`tlaunch.k8s.children`), the same layout.
    """
    save, checkpoint = job.paths(os.path.join(place.started_in or os.getcwd(), MODELS))
    ssh = place.ssh()
    folder = save or (os.path.dirname(checkpoint) if checkpoint else None)
    if folder is None:
        return list(job.script), ssh
    if place.local or place.allocation:
        private_dirs(folder, top=os.path.dirname(folder))  # 0700 when new; one that exists keeps its mode
    else:
        ssh = ssh or SSHOptions()
        setup = ssh.setup if isinstance(ssh.setup, dict) else dict.fromkeys(place.hosts, ssh.setup or [])
        made = shlex.join(["mkdir", "-p", "-m", "700", "--", os.path.dirname(folder), folder])
        ssh = dataclasses.replace(ssh, setup={h: [*setup.get(h, []), made] for h in place.hosts})
    return [*job.script, *path_arguments(save, checkpoint)], ssh


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
