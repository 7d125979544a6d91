"""What a submitted SLURM batch job runs: ``python -m tlaunch.backends.slurm.jobmain RUN_DIR``.

The batch script (``tlaunch.backends.slurm.batch``) feeds it the program,
cloudpickled and base64-encoded; it launches it with ``launch_type="slurm"``
in the job's allocation, prints every node's output (SLURM writes it to
``slurm-<id>.out``), and writes ``result.json`` into ``RUN_DIR`` as it ends:
``completed``, ``failed`` (with the first failing node's key, host and
traceback) or ``cancelled``. SIGTERM (``scancel``, the time limit) stops the
run like Ctrl-C. The exit code is 0, 1 (a node failed) or 143 (stopped).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import cloudpickle

__all__ = ["main"]


class _Terminated(Exception):
    """SIGTERM arrived (``scancel``, the time limit)."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def _write_result(run_dir: str, result: dict[str, Any]) -> None:
    path = os.path.join(run_dir, "result.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run the program of the batch script; 0 when it completed."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(
            "usage: python -m tlaunch.backends.slurm.jobmain RUN_DIR  (the program on stdin)", file=sys.stderr
        )
        return 2
    run_dir = args[0]
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    # The run inside the job keeps its record and node logs with the submission.
    os.environ["TLAUNCH_HOME"] = os.path.join(run_dir, "batch")
    data = cloudpickle.loads(base64.decodebytes(sys.stdin.buffer.read()))
    signal.signal(signal.SIGTERM, _on_term)

    from tlaunch.errors import RunFailedError
    from tlaunch.launcher import launch

    result: dict[str, Any] = {"job": os.environ.get("SLURM_JOB_ID"), "started": time.time()}
    code = 0
    try:
        run = launch(data["program"], launch_type="slurm", **data["launch"])
        result.update(state="completed", run_id=run.run_id, stop_reason=run.stop_reason)
    except RunFailedError as exc:
        result["state"] = "failed"
        result["failure"] = {
            "key": exc.node,
            "host": exc.host,
            "exit_code": exc.exit_code,
            "reason": exc.reason,
            "traceback": exc.remote_traceback,
        }
        code = 1
    except (_Terminated, KeyboardInterrupt):
        result["state"] = "cancelled"
        code = 143
    finally:
        result["ended"] = time.time()
        _write_result(run_dir, result)
    return code


if __name__ == "__main__":
    sys.exit(main())
