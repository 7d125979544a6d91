"""Where a job goes: :class:`Hosts`, :class:`Slurm` or :class:`Kubernetes` (a :data:`Target`).

A :class:`~tlaunch.jobs.JobSpec` says what runs; its target says where, and
what that place needs said (an ssh config, a partition, a namespace). The
SLURM target also turns the job's resources into ``sbatch``'s
(:func:`slurm_options`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tlaunch.backends.slurm.options import SlurmOptions
from tlaunch.errors import LaunchError
from tlaunch.jobs import JobSpec
from tlaunch.runtime.pyenv import RuntimeEnv

__all__ = ["Hosts", "Kubernetes", "Slurm", "Target", "slurm_options"]


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
        namespace: the job's namespace (default: the ``JobSpec``'s; if it names none, the
            credentials' own: :func:`tlaunch.k8s.client.namespace_of`).
        kube_config: a kubeconfig file (default: ``$KUBECONFIG``, the pod's service
            account, ``~/.kube/config``: :mod:`tlaunch.k8s.client`).
        working_dir: a folder (the job's package) shipped to every pod in the job's
            run Secret (at most about 700 KiB packed) and unpacked as its working directory.
        runtime_env: requirements installed in a virtualenv before the command, in each
            pod (on the job's ``/TData`` volume when it has one: once for all its pods;
            :mod:`tlaunch.k8s.package`); its folder is ``working_dir``.
        impersonate: the user the API server creates the job as (``Impersonate-User``: that
            user's RBAC decides what it may make, and where; a job server's ``--unix-users``).
    """

    namespace: str | None = None
    kube_config: str | None = None
    working_dir: str | None = None
    runtime_env: RuntimeEnv | None = None
    impersonate: str | None = None


Target = Hosts | Slurm | Kubernetes
"""Where :func:`submit` places a job."""


def slurm_options(job: JobSpec, target: Slurm) -> SlurmOptions:
    """The ``sbatch`` options of ``job`` on ``target``: its nodes, GPUs, CPUs and memory, the target's own.

    Raises:
        LaunchError: a Kubernetes-only setting, or a quantity SLURM cannot take.
    """
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
