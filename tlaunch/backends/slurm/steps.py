"""A run's nodes as steps of a SLURM job: their ``srun`` command, their names, finding and cancelling them.

Each node of a ``launch_type="slurm"`` run is one step (``srun --overlap`` on
its node) named ``tlaunch:<run id>:<node key>``, so that ``squeue -s`` lists a
run's steps, and only its, by that prefix: the backend cancels them by it when
a node must die at once, and confirms at the end that none is left.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Sequence

from tlaunch.backends.slurm.commands import run_slurm
from tlaunch.errors import LaunchError

__all__ = ["cancel_steps", "cancel_steps_until_gone", "run_steps", "step_argv", "step_name"]


def step_name(run_id: str, key: str) -> str:
    """The name of node ``key``'s step (``squeue -s`` shows it)."""
    return f"tlaunch:{run_id}:{key}"


def step_argv(
    job_id: str, node: str, run_id: str, key: str, srun_args: Sequence[str], command: Sequence[str]
) -> list[str]:
    """``srun`` running ``command`` as node ``key``'s step: one task on ``node``, sharing its CPUs, GPUs."""
    return [
        "srun",
        f"--jobid={job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--overlap",
        "--quiet",
        f"--job-name={step_name(run_id, key)}",
        *srun_args,
        *command,
    ]


def run_steps(job_id: str, run_id: str) -> list[str]:
    """The run's steps that SLURM still lists (``JOB.STEP``); none if SLURM cannot be asked."""
    with contextlib.suppress(LaunchError):
        out = run_slurm(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"])
        prefix = step_name(run_id, "")
        return [
            line.split()[0]
            for line in out.splitlines()
            if line.split()[1:2] and line.split()[1].startswith(prefix)
        ]
    return []


def cancel_steps(job_id: str, run_id: str) -> None:
    """``scancel`` the run's steps that SLURM still lists."""
    steps = run_steps(job_id, run_id)
    if steps:
        subprocess.run(["scancel", "--quiet", *steps], capture_output=True, check=False, timeout=30)


def cancel_steps_until_gone(job_id: str, run_id: str, timeout: float) -> list[str]:
    """Cancel the run's steps until SLURM lists none, for ``timeout`` s at most; those it still lists."""
    deadline = time.monotonic() + timeout
    steps = run_steps(job_id, run_id)
    while steps and time.monotonic() < deadline:
        cancel_steps(job_id, run_id)
        time.sleep(0.3)
        steps = run_steps(job_id, run_id)
    return steps
