"""The ``program`` and ``function`` launch methods: a function of the job's package, run by its runner.

A job of either names ``FILE:FUNCTION`` of its package as its script (its
other items are the program's ``sys.argv`` for ``program``, the function's
arguments for ``function``):

- ``program``: the function returns a Launchpad-style :class:`tlaunch.Program`
  (:mod:`tlaunch.jobs.program` holds the contract: ``pservers=N`` and its
  ``pserver`` group), launched on the job's hosts (unplaced nodes spread over
  them), on this machine, or inside a SLURM allocation (each node a step);
- ``function`` (torchrunx-style): the function runs in ``nproc_per_node``
  workers on each host (:func:`tlaunch.torch.launch`, with torch's process
  group when torch is there); :func:`run_function` returns what every worker
  returned, which the job's entry point keeps with the run (``results()``).

Both are runners of :data:`tlaunch.control.starting.runners.RUNNERS`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import Any

from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.control.starting.place import Place
from tlaunch.jobs import JobSpec
from tlaunch.jobs.program import ProgramRef, load_function, load_program, place_program
from tlaunch.launcher import launch
from tlaunch.options import LaunchOptions

__all__ = ["run_function", "run_program"]


def _reference(text: str, working_dir: str | None) -> tuple[str, ProgramRef]:
    """The package's folder and the reference in it (an absolute ``FILE`` names its folder: SLURM)."""
    file, _, function = text.rpartition(":")
    if os.path.isabs(file):
        return os.path.dirname(file), ProgramRef.parse(f"{os.path.basename(file)}:{function}")
    return working_dir or os.getcwd(), ProgramRef.parse(text)


def run_program(job: JobSpec, place: Place) -> None:
    """Run a job of method ``program`` where it is placed, until it ends.

    Raises:
        TLaunchError: the program could not be made or launched, or a node failed.
    """
    folder, ref = _reference(job.script[0], place.working_dir)
    sys.argv = [ref.file, *job.script[1:]]  # the program's flags (absl, argparse) are the job's args
    program = load_program(folder, ref, job.pservers)
    options = LaunchOptions(env=dict(job.env))
    if place.allocation or place.local:  # an allocation's launch places its nodes itself
        launch(program, options=options, run_id=place.run_id)
        return
    place_program(program, list(place.hosts))
    ssh = dataclasses.replace(place.ssh() or SSHOptions(), working_dir=place.working_dir or folder)
    launch(program, "ssh", options=options, backend_options=ssh, run_id=place.run_id)


def run_function(job: JobSpec, place: Place) -> Any:
    """Run a job of method ``function`` where it is placed; what each host's workers returned.

    Raises:
        TLaunchError: the function could not be loaded, or a worker failed (its own exception).
    """
    from tlaunch.torch.function import launch as launch_function

    folder, ref = _reference(job.script[0], place.working_dir)
    function = load_function(folder, ref)
    result = launch_function(
        function,
        tuple(job.script[1:]),
        hostnames=list(place.hosts),
        workers_per_host=job.nproc_per_node,
        backend="auto" if importlib.util.find_spec("torch") else None,
        env=dict(job.env),
        ssh=place.ssh(),
        run_id=place.run_id,
    )
    return result.results
