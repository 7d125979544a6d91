"""What a job submitted to hosts runs: ``python -m tlaunch.control.starting.jobmain SPEC_FILE``.

:func:`tlaunch.control.submit` writes the job (a :class:`~tlaunch.jobs.JobSpec`
and its :class:`~tlaunch.control.submit.Hosts`) to a 0600 file and starts this
module in a session of its own; it reads the file, deletes it (the job's
environment never stays on disk or appears on a command line) and runs the
job's method with its host runner (its entry in
:data:`tlaunch.runtime.methods.METHODS`: the torch launchers for basic,
torchrun and deepspeed), whose run the store records (under the run id
``submit`` chose) with this process as its launcher. Its exit code is the
job's: 0 when it succeeded.

A job with a runtime environment (:mod:`tlaunch.control.starting.envs`) is first
recorded as being prepared, then its environments are built; on this machine
the launcher then replaces itself (``exec``) with the environment's
interpreter and runs the job from there. SIGTERM stops it at any point: the
build (pip goes with it), or the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tlaunch.backends.recorded import STOPPED_PREPARING
from tlaunch.control.starting.envs import announce, prepare_here, prepare_hosts, record_failure
from tlaunch.errors import TLaunchError
from tlaunch.jobs import JobSpec
from tlaunch.runtime.methods import get_method
from tlaunch.runtime.pyenv import EnvBuildError, RuntimeEnv
from tlaunch.runtime.records import write_private

__all__ = ["main", "run_job"]


def run_job(
    job: JobSpec,
    hosts: Sequence[str],
    ssh_config: str | None,
    working_dir: str | None,
    *,
    run_id: str | None = None,
    python: Mapping[str, str] | None = None,
) -> None:
    """Run ``job``'s method on ``hosts`` until it ends, with the method's host runner.

    Args:
        run_id: the run's id (default: one made from the method's program).
        python: each SSH host's interpreter (its runtime environment's).

    Raises:
        TLaunchError: the job failed (a rank's error, a host lost...), or its method does not run on hosts.
    """
    runner = get_method(job.method).host_runner()
    if working_dir and _local(hosts):
        os.chdir(working_dir)  # nothing to ship: the ranks start here, in the job's folder
        working_dir = None
    runner(job, list(hosts), ssh_config, working_dir, run_id=run_id, python=python)


def _local(hosts: Sequence[str]) -> bool:
    return all(h in ("localhost", "127.0.0.1") for h in hosts)


def _prepare(
    job: JobSpec, target: dict[str, Any], env: RuntimeEnv, run_id: str, given: dict[str, Any], spec_file: str
) -> dict[str, str] | None:
    """Record the run as preparing and build its environments; each SSH host's interpreter.

    On this machine it does not return: it runs the job again in the environment's interpreter.
    """
    hosts = list(target["hosts"])
    where = "this machine" if _local(hosts) else ", ".join(dict.fromkeys(hosts))
    run_dir = announce(
        run_id,
        job.lpjob_name,
        hosts,
        target.get("ssh_config"),
        f"building its runtime environment (pip install -r {env.requirements}) on {where}",
    )
    if not _local(hosts):
        return prepare_hosts(env, hosts, target.get("ssh_config"), run_dir)
    python = prepare_here(env, run_dir)
    again = f"{spec_file}.in-env"
    write_private(again, json.dumps({**given, "in_env": True}).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, [python, "-m", "tlaunch.control.starting.jobmain", again])
    raise AssertionError("not reached")


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: a build's pip, or the run, is stopped on the way


def main(argv: Sequence[str] | None = None) -> int:
    """Read the job's file (and delete it), run the job; 0 when it succeeded."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m tlaunch.control.starting.jobmain SPEC_FILE", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        given = json.load(f)
    os.unlink(args[0])
    signal.signal(signal.SIGTERM, _terminated)
    target = given["target"]
    run_id = given.get("run_id")
    env = RuntimeEnv(**target["runtime_env"]) if target.get("runtime_env") and run_id else None
    python = None
    try:
        job = JobSpec(**{**given["job"], "script": tuple(given["job"]["script"])})
        if env is not None and not given.get("in_env"):
            python = _prepare(job, target, env, run_id, given, args[0])
        run_job(
            job,
            target["hosts"],
            target.get("ssh_config"),
            target.get("working_dir"),
            run_id=run_id,
            python=python,
        )
    except EnvBuildError as exc:
        print(f"tlaunch job: {exc}", file=sys.stderr)
        record_failure(run_id, exc.report(), exc.summary)
        return 1
    except TLaunchError as exc:
        print(f"tlaunch job: {exc}", file=sys.stderr)
        if env is not None:  # a run recorded as preparing that never started: its record says why
            record_failure(run_id, {"key": "launcher", "host": "localhost", "reason": str(exc)}, str(exc))
        return 1
    except SystemExit:
        if env is not None:
            record_failure(run_id, None, STOPPED_PREPARING, kind="requested")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
