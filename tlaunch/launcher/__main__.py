"""What a submitted program's batch job runs: ``python -m tlaunch.launcher RUN_DIR`` (the program on stdin).

``launch(..., launch_type="slurm", submit=True)`` names this module to its
backend (:mod:`tlaunch.backends.slurm.batch` writes it into the batch script).
It reads the program, its launch (:class:`~tlaunch.launcher.submitted.Submitted`)
and the backend's options for inside the job, cloudpickled and
base64-encoded; launches it in the job's allocation (its run keeps its
record and node logs under ``RUN_DIR/batch``), its nodes' output going to
SLURM's ``slurm-<id>.out``; and writes how it ended into ``RUN_DIR`` in the one
result format of detached jobs (:mod:`tlaunch.runtime.results`). SIGTERM
(``scancel``, the time limit) stops the run like Ctrl-C. The exit code is 0,
1 (a node failed) or 143 (stopped).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import signal
import sys
import time
from types import FrameType

import cloudpickle

from tlaunch.errors import RunFailedError
from tlaunch.launcher import launch
from tlaunch.launcher.submitted import Submitted
from tlaunch.runtime.results import JobResult, write_result

__all__ = ["main"]


class _Terminated(Exception):
    """SIGTERM arrived (``scancel``, the time limit)."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def main(argv: list[str] | None = None) -> int:
    """Run the program of the batch script; 0 when it completed."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tlaunch.launcher RUN_DIR  (the program on stdin)", file=sys.stderr)
        return 2
    run_dir = args[0]
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    # The run inside the job keeps its record and node logs with the submission.
    os.environ["TLAUNCH_HOME"] = os.path.join(run_dir, "batch")
    data = cloudpickle.loads(base64.decodebytes(sys.stdin.buffer.read()))
    given: Submitted = data["launch"]
    signal.signal(signal.SIGTERM, _on_term)
    started, job = time.time(), os.environ.get("SLURM_JOB_ID")
    result = JobResult("cancelled", stop_reason="stopped (SIGTERM)", slurm_job=job, started=started)
    code = 143
    try:
        run = launch(
            data["program"],
            given.launch_type,
            terminal=given.terminal,
            options=given.options,
            backend_options=data["backend_options"],
        )
        result = JobResult(
            "completed", None, run.stop_reason, run_id=run.run_id, slurm_job=job, started=started
        )
        code = 0
    except RunFailedError as exc:
        failure = {"key": exc.node, "host": exc.host, "exit_code": exc.exit_code, "reason": exc.reason,
                   "traceback": exc.remote_traceback}  # fmt: skip
        result = JobResult("failed", failure, slurm_job=job, started=started)
        code = 1
    except (_Terminated, KeyboardInterrupt):
        pass
    finally:
        write_result(run_dir, dataclasses.replace(result, ended=time.time()))
    return code


if __name__ == "__main__":
    sys.exit(main())
