"""The ``program`` and ``function`` launch methods: a function of the job's package, run by its launcher.

A job of either names ``FILE:FUNCTION`` of its package as its script (its
other items are the program's ``sys.argv`` for ``program``, the function's
arguments for ``function``):

- ``program``: the function returns a Launchpad-style :class:`tlaunch.Program`
  (:mod:`tlaunch.jobs.program` holds the contract: ``pservers=N`` and its
  ``pserver`` group), launched on the job's hosts (unplaced nodes spread over
  them), on this machine, or inside a SLURM allocation (each node a step);
- ``function`` (torchrunx-style): the function runs in ``nproc_per_node``
  workers on each host (:func:`tlaunch.torch.launch`, with torch's process
  group when torch is there); what every worker returned is kept in the run's
  folder as ``results.json`` when it is JSON-able (the job server shows it).

On hosts, :mod:`tlaunch.control.starting.jobmain` calls :func:`run_program_job` or
:func:`run_function_job` (their entries in :data:`tlaunch.runtime.methods.METHODS`);
in a SLURM allocation the batch script runs::

    python -m tlaunch.control.starting.programs program|function [--pservers N] [--workers N] \
        -- FILE:FUNCTION ARGS...
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tlaunch.errors import TLaunchError
from tlaunch.hosts import parse_host
from tlaunch.jobs.program import ProgramRef, load_function, load_program, place_program
from tlaunch.launcher import launch
from tlaunch.runtime.records import runs_dir, write_private

__all__ = ["RESULTS", "main", "run_function_job", "run_program_job"]

RESULTS = "results.json"
"""A ``function`` job's results, in its run's folder: ``{"results": {host: [...]}}`` (or why not)."""


def _reference(text: str, working_dir: str | None) -> tuple[str, ProgramRef]:
    """The package's folder and the reference in it (an absolute ``FILE`` names its folder: SLURM)."""
    file, _, function = text.rpartition(":")
    if os.path.isabs(file):
        return os.path.dirname(file), ProgramRef.parse(f"{os.path.basename(file)}:{function}")
    return working_dir or os.getcwd(), ProgramRef.parse(text)


def run_program_job(
    job: Any,
    hosts: Sequence[str],
    ssh_config: str | None,
    working_dir: str | None,
    *,
    run_id: str | None = None,
    python: Mapping[str, str] | None = None,
) -> None:
    """Run a :class:`~tlaunch.jobs.JobSpec` of method ``program`` on ``hosts`` until it ends (host runner).

    Raises:
        TLaunchError: the program could not be made or launched, or a node failed.
    """
    folder, ref = _reference(job.script[0], working_dir)
    sys.argv = [ref.file, *job.script[1:]]  # the program's flags (absl, argparse) are the job's args
    program = load_program(folder, ref, job.pservers)
    options: dict[str, Any] = {"env": dict(job.env)}
    if run_id is not None:
        options["run_id"] = run_id
    if not all(parse_host(h).is_local for h in hosts):
        place_program(program, hosts)
        options.update(launch_type="ssh", ssh_config=ssh_config, working_dir=working_dir or folder)
        if python:
            options["python"] = dict(python)
    launch(program, **options)


def run_function_job(
    job: Any,
    hosts: Sequence[str] | str,
    ssh_config: str | None,
    working_dir: str | None,
    *,
    run_id: str | None = None,
    python: Mapping[str, str] | None = None,
) -> None:
    """Run a :class:`~tlaunch.jobs.JobSpec` of method ``function`` on ``hosts`` (its host runner).

    Raises:
        TLaunchError: the function could not be loaded, or a worker failed (its own exception).
    """
    from tlaunch.backends.ssh.options import SSHOptions
    from tlaunch.torch.function import launch as launch_function

    folder, ref = _reference(job.script[0], working_dir)
    function = load_function(folder, ref)
    result = launch_function(
        function,
        tuple(job.script[1:]),
        hostnames=hosts if isinstance(hosts, str) else list(hosts),
        workers_per_host=job.nproc_per_node,
        ssh_config_file=ssh_config,
        backend="auto" if importlib.util.find_spec("torch") else None,
        env=dict(job.env),
        working_dir=working_dir,
        ssh=SSHOptions(python=dict(python)) if python else None,
        run_id=run_id,
    )
    try:
        kept: dict[str, Any] = {"results": result.results}
        data = json.dumps(kept).encode()
    except (TypeError, ValueError) as exc:
        data = json.dumps({"results": None, "why": f"the results are not JSON: {exc}"}).encode()
    write_private(os.path.join(runs_dir(), result.run_id, RESULTS), data)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tlaunch.control.starting.programs``: a program or function job in a SLURM allocation."""
    p = argparse.ArgumentParser(prog="python -m tlaunch.control.starting.programs")
    p.add_argument("method", choices=("program", "function"))
    p.add_argument("--pservers", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("script", nargs="+", help="FILE:FUNCTION and its arguments, after --")
    a = p.parse_args(argv)
    job = argparse.Namespace(script=a.script, pservers=a.pservers, nproc_per_node=a.workers, env={})
    try:
        if a.method == "program":
            run_program_job(job, ["localhost"], None, None)  # launch() places it on the allocation
        else:
            run_function_job(job, "slurm", None, None)
    except TLaunchError as exc:
        print(f"tlaunch job: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
