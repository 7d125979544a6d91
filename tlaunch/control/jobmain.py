"""What a job submitted to hosts runs: ``python -m tlaunch.control.jobmain SPEC_FILE``.

:func:`tlaunch.control.submit` writes the job (a :class:`~tlaunch.jobs.JobSpec`
and its :class:`~tlaunch.control.submit.Hosts`) to a 0600 file and starts this
module in a session of its own; it reads the file, deletes it (the job's
environment never stays on disk or appears on a command line) and runs the
job's method with its host runner (its entry in
:data:`tlaunch.runtime.methods.METHODS`: the torch launchers for basic,
torchrun and deepspeed), whose run the store records with this process as its
launcher. Its exit code is the job's: 0 when it succeeded.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from tlaunch.errors import TLaunchError
from tlaunch.jobs import JobSpec
from tlaunch.runtime.methods import get_method

__all__ = ["main", "run_job"]


def run_job(job: JobSpec, hosts: Sequence[str], ssh_config: str | None, working_dir: str | None) -> None:
    """Run ``job``'s method on ``hosts`` until it ends, with the method's host runner.

    Raises:
        TLaunchError: the job failed (a rank's error, a host lost...), or its method does not run on hosts.
    """
    runner = get_method(job.method).host_runner()
    if working_dir and all(h in ("localhost", "127.0.0.1") for h in hosts):
        os.chdir(working_dir)  # nothing to ship: the ranks start here, in the job's folder
        working_dir = None
    runner(job, list(hosts), ssh_config, working_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """Read the job's file (and delete it), run the job; 0 when it succeeded."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m tlaunch.control.jobmain SPEC_FILE", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        given = json.load(f)
    os.unlink(args[0])
    target = given["target"]
    try:
        job = JobSpec(**{**given["job"], "script": tuple(given["job"]["script"])})
        run_job(job, target["hosts"], target.get("ssh_config"), target.get("working_dir"))
    except TLaunchError as exc:
        print(f"tlaunch job: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
