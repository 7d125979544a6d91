"""``tlaunchrun --backend slurm``: a job as an sbatch job that runs its launch method on the allocation.

A renderer over :func:`tlaunch.control.submit` with a :class:`~tlaunch.control.Slurm` target.
"""

from __future__ import annotations

import argparse

from tlaunch.control import Slurm, sbatch_script, submit
from tlaunch.control.starting.submission import batch_job_file
from tlaunch.jobs import JobSpec

__all__ = ["submit_slurm"]


def submit_slurm(args: argparse.Namespace, spec: JobSpec) -> int:
    """``--backend slurm``: an sbatch job of ``num_trainer`` nodes that runs the method on them."""
    target = Slurm(
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        time=args.time,
        sbatch_args=tuple(args.sbatch_arg),
    )
    if args.dry_run:
        print(sbatch_script(spec, target), end="")
        print("# the job file the script runs (job.json in the run's folder):")
        print(f"# {batch_job_file(spec).to_json()}")
        return 0
    job = submit(spec, target)
    slurm_job = job.snapshot().refs.get("slurm_job")
    print(f"submitted SLURM job {slurm_job} (run {job.run_id}); follow it with: tlaunch logs -f {job.run_id}")
    return 0
