"""``tlaunchrun --backend slurm``: a job as an sbatch job that runs its launch method on the allocation."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from tlaunch.backends.slurm.batch import command_script, submit
from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.plan import new_run_id
from tlaunch.runtime.records import private_dirs, runs_dir

__all__ = ["slurm_command", "submit_slurm"]


def slurm_command(spec: JobSpec) -> list[str]:
    """The ``tlaunch`` command that runs ``spec``'s method on the allocation's nodes."""
    argv = [sys.executable, "-m", "tlaunch.cli.main", spec.method]
    if spec.method == "basic":
        argv += ["--num-trainer", str(spec.num_trainer)] + (
            ["--set-share-file"] if spec.set_share_file else []
        )
    elif spec.method == "torchrun":
        argv += [
            "--nnodes",
            spec.nnodes or str(spec.num_trainer),
            "--nproc-per-node",
            str(spec.nproc_per_node),
        ]
        argv += ["--max-restarts", str(spec.max_restarts)]
    else:
        argv += ["--num_gpus", str(spec.nproc_per_node)]
    return [*argv, *spec.script]  # spec.env is exported by the 0600 batch script, never put here


def submit_slurm(args: argparse.Namespace, spec: JobSpec) -> int:
    """``--backend slurm``: an sbatch job of ``num_trainer`` nodes that runs the method on them."""
    k8s_only = [n for n in ("gpu_memory", "gpu_cores", "tdata_claim") if getattr(spec, n)] + (
        ["gang"] if spec.gang else []
    )
    if k8s_only:
        raise LaunchError(f"{k8s_only} are Kubernetes settings; with --backend slurm drop them")
    opts = SlurmOptions(
        submit=True,
        nodes=spec.num_trainer,
        gpus_per_node=spec.gpu or None,
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        time=args.time,
        job_name=spec.lpjob_name,
        sbatch_args=list(args.sbatch_arg),
    )
    command = slurm_command(spec)
    run_id = new_run_id(spec.lpjob_name)
    run_dir = os.path.join(runs_dir(), run_id)
    if args.dry_run:
        print(command_script(opts, spec.lpjob_name, run_id, run_dir, command, spec.env), end="")
        return 0
    private_dirs(run_dir, top=os.path.dirname(runs_dir()))
    try:
        job = submit(opts, spec.lpjob_name, run_id, run_dir, None, command=command, command_env=spec.env)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    print(f"submitted SLURM job {job.job_id} (run {run_id}); follow it with: tlaunch logs -f {run_id}")
    return 0
