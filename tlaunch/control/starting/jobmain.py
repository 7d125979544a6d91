"""The one entry point of detached jobs: ``python -m tlaunch.control.starting.jobmain JOB_FILE``.

:func:`tlaunch.control.submit` writes the job once, as a file in its run
folder (:class:`~.jobfile.JobFile`, 0600), and starts this module where the
job runs: in a session of its own on this machine (for this machine and for
SSH hosts), or as the command of a SLURM batch job (on the allocation's first
node). It reads the file, deletes it (the job's environment never stays on
disk or appears on a command line), runs the job's method with its runner
(:data:`~.runners.RUNNERS`), whose run the store records (under the run id the
submitter chose, when it chose one) with this process as its launcher, and
writes how the job ended beside it, in the one format of every job
(:mod:`tlaunch.runtime.results`: state, root cause, what the job returned),
which the run's handle reads (``results()``). Its exit code is 0 when the job
succeeded, 1 when it failed, 128+N when signal N stopped it.

A job with a runtime environment (:mod:`.envs`) on hosts is first recorded as
being prepared, then its environments are built; on this machine the entry
point then replaces itself (``exec``) with the environment's interpreter and
runs the job from there (a SLURM batch job builds its environment in steps of
its own before this runs). SIGTERM stops it at any point: the build (pip goes
with it), or the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tlaunch.backends.recorded import STOPPED_PREPARING
from tlaunch.control.starting.envs import announce, describe, prepare_here, prepare_hosts, record_failure
from tlaunch.control.starting.jobfile import JobFile, entry_argv
from tlaunch.control.starting.place import Place
from tlaunch.control.starting.runners import runner_of
from tlaunch.errors import RunFailedError, TLaunchError
from tlaunch.jobs import JobSpec
from tlaunch.runtime.methods import get_method
from tlaunch.runtime.pyenv import EnvBuildError, RuntimeEnv
from tlaunch.runtime.results import JobResult, write_pending, write_result
from tlaunch.torch.errors import failure_report
from tlaunch.torch.placement import slurm_hostnames

__all__ = ["main", "run_job"]


def run_job(job: JobSpec, place: Place) -> Any:
    """Run ``job`` where it is placed, with its method's runner; what it returned (if its method keeps it).

    Raises:
        TLaunchError: the job failed (a rank's error, a host lost...).
    """
    place = replace(place, started_in=place.started_in or os.getcwd())
    if place.working_dir and place.local:
        os.chdir(place.working_dir)  # nothing to ship: the ranks start here, in the job's folder
        place = replace(place, working_dir=None)
    return runner_of(job.method)(job, place)


def _prepare(job_file: JobFile, env: RuntimeEnv, path: str) -> dict[str, str]:
    """Record the run as preparing and build its environments; each SSH host's interpreter.

    On this machine it does not return: it runs the job again in the environment's interpreter.
    """
    place = job_file.place
    assert place.run_id is not None
    hosts = list(place.hosts)
    where = "this machine" if place.local else ", ".join(dict.fromkeys(hosts))
    doing = f"building its runtime environment (pip install {describe(env)}) on {where}"
    run_dir = announce(place.run_id, job_file.job.lpjob_name, hosts, place.ssh_config, doing)
    if not place.local:
        return prepare_hosts(env, hosts, place.ssh_config, run_dir)
    python = prepare_here(env, run_dir)
    again = job_file.in_environment().write(f"{path}.in-env")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, entry_argv(again, python))
    raise AssertionError("not reached")


def _failure(exc: BaseException) -> dict[str, Any]:
    """The root cause's record (``Failure.from_report`` reads it) of a job that failed with ``exc``."""
    if isinstance(exc, EnvBuildError):
        return exc.report()
    if isinstance(exc, RunFailedError):
        return {"key": exc.node, "host": exc.host, "exit_code": exc.exit_code, "reason": exc.reason,
                "traceback": exc.remote_traceback}  # fmt: skip
    return failure_report(exc)


def _kept(job: JobSpec, returned: Any) -> dict[str, Any]:
    """What of the job's return value its result keeps (its method's ``keeps_results``, if it is JSON)."""
    if not get_method(job.method).keeps_results:
        return {}
    try:
        json.dumps(returned)
    except (TypeError, ValueError) as exc:
        return {"results_why": f"the results are not JSON: {exc}"}
    return {"results": returned}


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: a build's pip, or the run, is stopped on the way


def main(argv: Sequence[str] | None = None) -> int:
    """Read the job's file (and delete it), run the job, write how it ended; 0 when it succeeded."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m tlaunch.control.starting.jobmain JOB_FILE", file=sys.stderr)
        return 2
    path = args[0]
    folder = os.path.dirname(os.path.abspath(path))  # the run's folder: the result goes beside the job
    job_file = JobFile.take(path)
    signal.signal(signal.SIGTERM, _terminated)
    started, job, place = time.time(), job_file.job, job_file.place
    env = job_file.runtime_env if place.run_id is not None and not place.allocation else None
    slurm_job = os.environ.get("SLURM_JOB_ID") if place.allocation else None

    def ended(state: str, **fields: Any) -> None:
        if os.path.isdir(folder):  # (a launch that failed to start removed its run's folder)
            result = JobResult(state, slurm_job=slurm_job, started=started, ended=time.time(), **fields)  # type: ignore[arg-type]
            write_result(folder, result)

    if os.path.isdir(folder):
        write_pending(folder, started)  # until the job ends: its run is not read as ended before this
    try:
        if place.allocation:
            place = replace(place, hosts=tuple(slurm_hostnames()))
        if env is not None and not job_file.in_env:
            place = replace(place, python=_prepare(job_file, env, path))
        returned = run_job(job, place)
    except TLaunchError as exc:
        print(f"tlaunch job: {exc}", file=sys.stderr)
        failure = _failure(exc)
        if env is not None:  # a run recorded as preparing that never started: its record says why
            reason = exc.summary if isinstance(exc, EnvBuildError) else str(exc)
            record_failure(place.run_id or "", failure if isinstance(exc, EnvBuildError) else
                           {"key": "launcher", "host": "localhost", "reason": str(exc)}, reason)  # fmt: skip
        ended("failed", failure=failure, stop_reason=str(exc).splitlines()[0] if str(exc) else None)
        return 1
    except SystemExit:
        if env is not None:
            record_failure(place.run_id or "", None, STOPPED_PREPARING, kind="requested")
        ended("cancelled", stop_reason="stopped (SIGTERM)")
        raise
    ended("completed", **_kept(job, returned))
    return 0


if __name__ == "__main__":
    sys.exit(main())
