"""Submitting a job: one :class:`~tlaunch.jobs.JobSpec` onto hosts, a SLURM cluster or Kubernetes.

``submit(job, target)`` returns at once with the job's :class:`RunHandle`;
the job runs on without the caller (a job server may restart, a terminal may
close):

- :class:`Hosts` (SSH hosts, or ``localhost``): a launcher process of its own
  (its own session, ``python -m tlaunch.control.starting.jobmain``) runs the job's
  method (basic, torchrun, deepspeed) with the torch launchers; the job's
  description travels in a 0600 file that the launcher deletes as it reads it,
  so its environment is never on a command line. The handle is the run's,
  whose id ``submit`` chose.
- :class:`Slurm`: an ``sbatch`` job whose script (0600, in the run's folder)
  exports the job's environment and runs the method on the allocation's nodes;
  the handle is a :class:`~tlaunch.backends.slurm.SlurmJob`.
- :class:`Kubernetes`: the job's LPJob (:meth:`JobSpec.to_lpjob`), which the
  operator runs (``docs/k8s.md``); the handle is an
  :class:`~tlaunch.backends.k8s.LPJobRun`, recorded in the run store like the others.

A target's ``runtime_env`` (a package with a ``requirements.txt``) is built
on each host before the job runs there (:mod:`tlaunch.control.starting.envs`);
``submit`` then returns as soon as the run is recorded as ``PENDING``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from tlaunch.backends.handle import RunHandle
from tlaunch.backends.k8s.lpjobs import submit_lpjob
from tlaunch.backends.slurm.batch import command_script
from tlaunch.backends.slurm.batch import submit as sbatch
from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.control.runs import attach, runs_dir
from tlaunch.control.starting.envs import batch_steps, pod_package
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.plan import new_run_id
from tlaunch.runtime.methods import get_method
from tlaunch.runtime.pyenv import RuntimeEnv
from tlaunch.runtime.records import private_dirs, read_record, write_private

__all__ = ["Hosts", "Kubernetes", "Slurm", "Target", "lpjob_of", "method_command", "sbatch_script", "submit"]


@dataclass(frozen=True)
class Hosts:
    """Run the job on these hosts over SSH (``localhost``: this machine, no SSH).

    Attributes:
        hosts: host names of the ssh config, or ``user@host:port``; the first is rank 0's.
        ssh_config: the ssh config to read (default ``~/.ssh/config``).
        working_dir: a folder shipped to every host; the trainers start in it.
        runtime_env: requirements installed in a virtualenv on each host, in which
            the job runs (built once per package and host: :mod:`tlaunch.control.starting.envs`).
    """

    hosts: tuple[str, ...] = ("localhost",)
    ssh_config: str | None = None
    working_dir: str | None = None
    runtime_env: RuntimeEnv | None = None


@dataclass(frozen=True)
class Slurm:
    """Submit the job with ``sbatch``: ``num_trainer`` nodes (torchrun: the most of ``nnodes``).

    Attributes:
        partition, account, qos, time: the batch job's ``--partition`` etc.
        sbatch_args: more ``sbatch`` options, one per item.
        runtime_env: requirements installed in a virtualenv (the batch job's first
            step, on every node) in which the job runs; its folder and the
            submitting ``TLAUNCH_HOME`` must be on the cluster's shared filesystem.
    """

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    sbatch_args: tuple[str, ...] = ()
    runtime_env: RuntimeEnv | None = None


@dataclass(frozen=True)
class Kubernetes:
    """Create the job's LPJob; the operator runs it (``docs/k8s.md``).

    Attributes:
        namespace: the job's namespace (default: the ``JobSpec``'s).
        kube_config: a kubeconfig file (default: ``$KUBECONFIG``, the pod's service
            account, ``~/.kube/config``: :mod:`tlaunch.k8s.client`).
        working_dir: a folder (the job's package) shipped to every pod in the job's
            run Secret (at most about 700 KiB packed) and unpacked as its working directory.
        runtime_env: requirements installed in a virtualenv before the command, in each
            pod (on the job's ``/TData`` volume when it has one: once for all its pods;
            :mod:`tlaunch.k8s.package`); its folder is ``working_dir``.
    """

    namespace: str | None = None
    kube_config: str | None = None
    working_dir: str | None = None
    runtime_env: RuntimeEnv | None = None


Target = Hosts | Slurm | Kubernetes
"""Where :func:`submit` places a job."""


def method_command(job: JobSpec) -> list[str]:
    """The command that runs ``job``'s method on the hosts of a SLURM allocation (its entry's).

    Raises:
        LaunchError: the method does not run on SLURM.
    """
    return get_method(job.method).command_on_allocation(job)


def _slurm_options(job: JobSpec, target: Slurm) -> SlurmOptions:
    k8s_only = [n for n in ("gpu_memory", "gpu_cores", "tdata_claim") if getattr(job, n)]
    if k8s_only or job.gang:
        raise LaunchError(f"{k8s_only + (['gang'] if job.gang else [])} are Kubernetes settings; drop them")
    return SlurmOptions(
        submit=True,
        nodes=job.num_trainer,
        gpus_per_node=job.gpu or None,
        partition=target.partition,
        account=target.account,
        qos=target.qos,
        time=target.time,
        job_name=job.lpjob_name,
        sbatch_args=list(target.sbatch_args),
        cpus_per_task=_slurm_cpus(job.cpu),
        mem=_slurm_mem(job.memory),
    )


def _slurm_cpus(cpu: str | None) -> int | None:
    """A Kubernetes CPU quantity as SLURM's ``--cpus-per-task`` (whole CPUs, rounded up)."""
    if cpu is None:
        return None
    return max(1, -(-int(cpu[:-1]) // 1000)) if cpu.endswith("m") else max(1, math.ceil(float(cpu)))


def _slurm_mem(memory: str | None) -> str | None:
    """A Kubernetes memory quantity as SLURM's ``--mem`` (``16Gi`` -> ``16G``; bytes -> whole MiB)."""
    if memory is None:
        return None
    number, unit = memory.rstrip("KMGTPikmgtp"), memory.lstrip("0123456789.")
    factor = {"": 1, "k": 1e3, "Ki": 2**10, "M": 1e6, "Mi": 2**20, "G": 1e9, "Gi": 2**30, "T": 1e12,
              "Ti": 2**40, "m": 1e-3}.get(unit)  # fmt: skip
    if factor is None:
        raise LaunchError(f"memory={memory!r}: SLURM takes memory in bytes, k, M, G or T (Ki, Mi, Gi, Ti)")
    return f"{max(1, math.ceil(float(number) * factor / 2**20))}M"


def sbatch_script(job: JobSpec, target: Slurm, run_id: str = "<run id>", home: str | None = None) -> str:
    """The batch script :func:`submit` would write for ``job`` on ``target`` (a dry run).

    Raises:
        LaunchError: a value SLURM or the script cannot take.
    """
    run_dir = os.path.join(runs_dir(home), run_id)
    steps, argv = _batch_command(job, target, home, run_dir)
    return command_script(_slurm_options(job, target), job.lpjob_name, run_id, run_dir, argv, job.env, steps)


def _batch_command(
    job: JobSpec, target: Slurm, home: str | None, run_dir: str
) -> tuple[list[list[str]], list[str]]:
    """The batch job's steps before its command (a runtime environment's build), and the command."""
    if target.runtime_env is None:
        return [], method_command(job)
    return batch_steps(target.runtime_env, home, run_dir, method_command(job))


def submit(
    job: JobSpec,
    target: Target,
    *,
    home: str | None = None,
    timeout: float = 60.0,
    environ: Mapping[str, str] | None = None,
) -> RunHandle:
    """Start ``job`` on ``target``; its handle, at once (the job runs on without the caller).

    Args:
        job: what to run (the trainer's script, method, trainers, environment).
        target: where (:class:`Hosts`, :class:`Slurm` or :class:`Kubernetes`).
        home: the ``TLAUNCH_HOME`` whose run store records the job (default: ``$TLAUNCH_HOME``).
        timeout: seconds a :class:`Hosts` job may take to appear in the run store.
        environ: the environment the job's launcher (or ``sbatch``) starts with, under the
            job's own ``env`` (default: this process's; a job server gives
            :func:`tlaunch.control.starting.jobenv.job_environ`'s, never its own).

    Raises:
        LaunchError: a bad value, a cluster that refused the job, or a launcher that
            failed before its run started (its output is in the message).
    """
    if isinstance(target, Slurm):
        return _submit_slurm(job, target, home, environ)
    if isinstance(target, Hosts):
        return _submit_hosts(job, target, home, timeout, environ)
    if isinstance(target, Kubernetes):
        return _submit_kubernetes(job, target, home)
    raise LaunchError(
        f"target {target!r} is not Hosts(...), Slurm(...) or Kubernetes(...) of tlaunch.control.submit"
    )


def lpjob_of(job: JobSpec, target: Kubernetes) -> tuple[dict[str, Any], dict[str, bytes] | None]:
    """The LPJob :func:`submit` would create for ``job`` on ``target``, and its Secret's files (a dry run).

    Raises:
        LaunchError: a value the LPJob cannot take, or a package too large to ship.
    """
    if target.namespace is not None:
        job = replace(job, namespace=target.namespace)  # checked again
    lpjob, files = job.to_lpjob(), None
    if target.working_dir is not None:
        files, lpjob["spec"]["package"] = pod_package(target.working_dir, target.runtime_env)
        lpjob["spec"]["runFiles"] = True
    return lpjob, files


def _submit_kubernetes(job: JobSpec, target: Kubernetes, home: str | None) -> RunHandle:
    lpjob, files = lpjob_of(job, target)
    run_id = new_run_id(job.lpjob_name)
    run_dir = os.path.join(runs_dir(home), run_id)
    private_dirs(run_dir, top=os.path.dirname(runs_dir(home)))
    try:
        return submit_lpjob(lpjob, run_id, run_dir, target.kube_config, files)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _submit_slurm(
    job: JobSpec, target: Slurm, home: str | None, environ: Mapping[str, str] | None
) -> RunHandle:
    opts = _slurm_options(job, target)
    run_id = new_run_id(job.lpjob_name)
    run_dir = os.path.join(runs_dir(home), run_id)
    private_dirs(run_dir, top=os.path.dirname(runs_dir(home)))
    steps, argv = _batch_command(job, target, home, run_dir)
    try:
        return sbatch(
            opts,
            job.lpjob_name,
            run_id,
            run_dir,
            None,
            env=environ,  # sbatch passes its own environment on to the job (--export=ALL)
            command=argv,
            command_env=job.env,
            command_steps=steps,
        )
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _submit_hosts(
    job: JobSpec, target: Hosts, home: str | None, timeout: float, environ: Mapping[str, str] | None
) -> RunHandle:
    folder = os.path.join(os.path.dirname(runs_dir(home)), "submitted")
    private_dirs(folder, top=os.path.dirname(runs_dir(home)))
    name = f"{job.lpjob_name}-{uuid.uuid4().hex[:8]}"
    spec_file, out_file = os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}.out")
    run_id = new_run_id(job.lpjob_name)
    run_dir = os.path.join(runs_dir(home), run_id)
    given = {"job": asdict(job), "target": asdict(target), "run_id": run_id}
    write_private(spec_file, json.dumps(given).encode())
    env = dict(os.environ if environ is None else environ)
    if home is not None:
        env["TLAUNCH_HOME"] = home
    with open(out_file, "ab") as out:
        os.chmod(out_file, 0o600)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tlaunch.control.starting.jobmain", spec_file],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # it outlives the caller, and the caller's Ctrl-C
        )
    threading.Thread(target=proc.wait, name=f"reap {name}", daemon=True).start()  # no zombie
    deadline = time.monotonic() + timeout
    while True:
        ended = proc.returncode is not None  # asked before the store: a run that ends is recorded first
        try:  # recorded as it started, or as preparing (a runtime environment to build)
            return attach(run_dir, read_record(run_dir))
        except (OSError, ValueError):
            pass
        if ended:
            break
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)  # its session: the launcher and anything it began
            break
        time.sleep(0.05)
    with open(out_file, encoding="utf-8", errors="replace") as f:
        said = f.read()[-3000:].strip()
    with_pid = f"(pid {proc.pid}, exit code {proc.wait()})"
    raise LaunchError(f"job {job.lpjob_name!r} did not start on {list(target.hosts)} {with_pid}: {said}")
