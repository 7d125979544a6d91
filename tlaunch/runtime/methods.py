"""A job's launch method, one entry each: how it runs on hosts, on a SLURM allocation, in a Kubernetes pod.

A job (:class:`tlaunch.jobs.JobSpec`: a trainer's script, its trainers, their
environment) names its method; everything that starts a job reads the
method's entry in :data:`METHODS` and nothing else::

    where the job goes                              what it reads of the entry
    ──────────────────────────────────────────────  ─────────────────────────────────────────────
    hosts: control.submit(job, Hosts(...)),         run_on_hosts ("module:function", called by
      the job server                                  python -m tlaunch.control.starting.jobmain)
    SLURM: control.submit(job, Slurm(...)),         allocation_command (the batch script's command)
      tlaunchrun --backend slurm
    Kubernetes: the LPJob operator, tlaunchrun      pod_command, pod_files (tlaunch.k8s.children),
                                                      the CRD's list of methods
    tlaunch torchrun / deepspeed / basic            summary (tlaunch.cli.torch)

Adding a method is adding a :class:`Method` to :data:`METHODS`: its host
runner (a function ``run(job, hosts, ssh_config, working_dir)`` anywhere in
tlaunch), its command on an allocation, its pod command; a part left None is
a target the method cannot use, refused with a clear error.

This module is pure and sits low in the layers (the operator, in
``tlaunch.k8s``, reads it); the code that runs a method on hosts lives above
it (``tlaunch.torch``), so an entry names its runner by import path, which
only ``tlaunch.control.starting.jobmain`` resolves, when it runs a job.
"""

from __future__ import annotations

import base64
import importlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tlaunch.errors import LaunchError

__all__ = [
    "METHODS",
    "RDZV_PORT",
    "TORCH_MASTER_PORT",
    "HostRunner",
    "Method",
    "MethodJob",
    "Pods",
    "get_method",
    "method_names",
]

TORCH_MASTER_PORT = 29500
"""Rank 0's port in a pod (``MASTER_PORT``; DeepSpeed's default; the job's service exposes it)."""
RDZV_PORT = 29400
"""torchrun's c10d rendezvous port on the first pod (the job's service exposes it)."""


class MethodJob(Protocol):
    """What a method reads of a job (a :class:`tlaunch.jobs.JobSpec` is one)."""

    @property
    def method(self) -> str: ...
    @property
    def script(self) -> Sequence[str]: ...
    @property
    def num_trainer(self) -> int: ...
    @property
    def set_share_file(self) -> bool: ...
    @property
    def nnodes(self) -> str | None: ...
    @property
    def nproc_per_node(self) -> int: ...
    @property
    def max_restarts(self) -> int: ...
    @property
    def pservers(self) -> int: ...


class HostRunner(Protocol):
    """Runs a job's method on hosts until it ends (``localhost``: this machine, else over SSH)."""

    def __call__(
        self,
        job: Any,
        hosts: Sequence[str],
        ssh_config: str | None,
        working_dir: str | None,
        *,
        run_id: str | None = None,
        python: Mapping[str, str] | None = None,
    ) -> None:
        """Run ``job`` (a :class:`~tlaunch.jobs.JobSpec`) on ``hosts``; a ``TLaunchError`` if it fails.

        ``run_id`` is the run's id (its launcher recorded it while it prepared the job's
        runtime environment); ``python``, each SSH host's interpreter (that environment's).
        """


@dataclass(frozen=True)
class Pods:
    """A job's pods as its method sees them (:mod:`tlaunch.k8s.children` fills this in from the LPJob).

    Attributes:
        job: the LPJob's name.
        hosts: each trainer pod's stable DNS name, by index (the first hosts rendezvous).
        settings: the method's own section of the LPJob's spec (``spec.torchrun``...).
    """

    job: str
    hosts: tuple[str, ...]
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class Method:
    """One launch method of jobs (see the module docstring).

    Attributes:
        name: its name (``JobSpec.method``, the LPJob's ``spec.launcher``, a ``tlaunch`` command).
        summary: one line on what runs on each node.
        run_on_hosts: ``"module:function"`` of its :class:`HostRunner` (None: not on hosts).
        allocation_command: the command a SLURM batch script runs on the first node of
            the job's allocation, whose nodes are the job's hosts (None: not on SLURM).
        pod_command: each pod's command, given the pods, the pod's index and the
            trainer's own command (None: not on Kubernetes).
        pod_files: files every pod gets in ``/etc/tlaunch`` (a ConfigMap), by name.
        pservers: the method's program has a parameter-server group, whose replica
            count is the job's ``pservers`` (other methods refuse ``pservers``).
    """

    name: str
    summary: str
    run_on_hosts: str | None
    allocation_command: Callable[[MethodJob], list[str]] | None
    pod_command: Callable[[Pods, int, list[str]], list[str]] | None
    pod_files: Callable[[Pods], dict[str, str]] | None = None
    pservers: bool = False

    def host_runner(self) -> HostRunner:
        """The function that runs this method on hosts.

        Raises:
            LaunchError: the method does not run on hosts, or its runner cannot be imported here.
        """
        if self.run_on_hosts is None:
            raise LaunchError(f"method {self.name!r} does not run on hosts; {_where_else(self)}")
        module, _, name = self.run_on_hosts.partition(":")
        try:
            runner: HostRunner = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            raise LaunchError(
                f"method {self.name!r}: its host runner {self.run_on_hosts!r} cannot be imported here "
                f"({exc}); install what it needs (e.g. pip install 'tlaunch[torch]')"
            ) from exc
        return runner

    def command_on_allocation(self, job: MethodJob) -> list[str]:
        """The command that runs ``job`` on its SLURM allocation.

        Raises:
            LaunchError: the method does not run on SLURM.
        """
        if self.allocation_command is None:
            raise LaunchError(f"method {self.name!r} does not run on SLURM; {_where_else(self)}")
        return self.allocation_command(job)

    def command_in_pod(self, pods: Pods, index: int, user: list[str]) -> list[str]:
        """The command of pod ``index`` of ``pods``, around the trainer's own command ``user``.

        Raises:
            LaunchError: the method does not run on Kubernetes.
        """
        if self.pod_command is None:
            raise LaunchError(f"method {self.name!r} does not run on Kubernetes; {_where_else(self)}")
        return self.pod_command(pods, index, user)


def _where_else(method: Method) -> str:
    targets = [
        target
        for target, part in (
            ("hosts", method.run_on_hosts),
            ("SLURM", method.allocation_command),
            ("Kubernetes", method.pod_command),
        )
        if part is not None
    ]
    return f"it runs on {', '.join(targets)}" if targets else "it runs nowhere yet"


def _tlaunch(*argv: str) -> list[str]:
    """``python -m tlaunch.cli.main ARGV``: a readable command line in a batch script."""
    return [sys.executable, "-m", "tlaunch.cli.main", *argv]


# -- basic: N trainers, each told its rank ----------------------------------------------


def _basic_allocation(job: MethodJob) -> list[str]:
    share = ["--set-share-file"] if job.set_share_file else []
    return _tlaunch("basic", "--num-trainer", str(job.num_trainer), *share, *job.script)


def _basic_pod(pods: Pods, index: int, user: list[str]) -> list[str]:
    return user  # the pod's RANK, WORLD_SIZE and MASTER_ADDR are all the trainer needs


# -- torchrun: torch's elastic agent on every node ---------------------------------------


def _torchrun_allocation(job: MethodJob) -> list[str]:
    nnodes = job.nnodes or str(job.num_trainer)
    return _tlaunch(
        "torchrun",
        *("--nnodes", nnodes, "--nproc-per-node", str(job.nproc_per_node)),
        *("--max-restarts", str(job.max_restarts)),
        *job.script,
    )


def _torchrun_pod(pods: Pods, index: int, user: list[str]) -> list[str]:
    s = pods.settings
    return [
        "torchrun",
        f"--nnodes={s.get('nnodes', str(len(pods.hosts)))}",
        f"--nproc-per-node={s.get('nprocPerNode', 1)}",
        f"--max-restarts={s.get('maxRestarts', 0)}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={pods.hosts[0]}:{s.get('rdzvPort', RDZV_PORT)}",
        f"--rdzv-id={pods.job}",
        *user,
    ]


# -- deepspeed: DeepSpeed's per-node launcher ----------------------------------------------


def _deepspeed_allocation(job: MethodJob) -> list[str]:
    return _tlaunch("deepspeed", "--num_gpus", str(job.nproc_per_node), *job.script)


def _deepspeed_slots(pods: Pods) -> int:
    return int(pods.settings.get("slotsPerNode", 1))


def _deepspeed_pod(pods: Pods, index: int, user: list[str]) -> list[str]:
    world = {host: list(range(_deepspeed_slots(pods))) for host in pods.hosts}
    info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    return [
        "python",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={info}",
        f"--node_rank={index}",
        f"--master_addr={pods.hosts[0]}",
        f"--master_port={pods.settings.get('masterPort', TORCH_MASTER_PORT)}",
        *user,
    ]


def _deepspeed_files(pods: Pods) -> dict[str, str]:
    slots = _deepspeed_slots(pods)
    return {"hostfile": "".join(f"{host} slots={slots}\n" for host in pods.hosts)}


# -- command: N trainers, each running any program with its rank ---------------------------


def _command_allocation(job: MethodJob) -> list[str]:
    share = ["--set-share-file"] if job.set_share_file else []
    return _tlaunch("basic", "--command", "--num-trainer", str(job.num_trainer), *share, *job.script)


# -- program, function: a function of the job's package ------------------------------------


def _program_allocation(job: MethodJob) -> list[str]:
    pservers = ["--pservers", str(job.pservers)] if job.pservers else []
    return [
        sys.executable,
        "-m",
        "tlaunch.control.starting.programs",
        "program",
        *pservers,
        "--",
        *job.script,
    ]


def _function_allocation(job: MethodJob) -> list[str]:
    workers = ["--workers", str(job.nproc_per_node)]
    return [
        sys.executable,
        "-m",
        "tlaunch.control.starting.programs",
        "function",
        *workers,
        "--",
        *job.script,
    ]


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "basic",
            "N trainers, each with RANK, WORLD_SIZE and an optional shared file; the script does the rest",
            "tlaunch.torch.basic:run_job",
            _basic_allocation,
            _basic_pod,
        ),
        Method(
            "torchrun",
            "torch's elastic agent on every node, c10d rendezvous on the first",
            "tlaunch.torch.torchrun:run_job",
            _torchrun_allocation,
            _torchrun_pod,
        ),
        Method(
            "deepspeed",
            "DeepSpeed's per-node launcher on every node, with the job's hostfile",
            "tlaunch.torch.deepspeed:run_job",
            _deepspeed_allocation,
            _deepspeed_pod,
            _deepspeed_files,
        ),
        Method(
            "command",
            "N trainers, each running the job's command (any program) with RANK and WORLD_SIZE",
            "tlaunch.torch.basic:run_command_job",
            _command_allocation,
            _basic_pod,
        ),
        Method(
            "program",
            "a Launchpad-style program made by FILE:FUNCTION of the package (pservers: its 'pserver' group)",
            "tlaunch.control.starting.programs:run_program_job",
            _program_allocation,
            None,  # on Kubernetes a program is launched with launch_type='k8s' (an LPJob of its own shape)
            pservers=True,
        ),
        Method(
            "function",
            "FILE:FUNCTION of the package in nproc_per_node workers per host; its results kept",
            "tlaunch.control.starting.programs:run_function_job",
            _function_allocation,
            None,
        ),
    )
}
"""Every launch method, by name, in the order they are listed to users."""


def method_names(target: str | None = None) -> tuple[str, ...]:
    """The methods' names; with ``target`` (``hosts``, ``slurm``, ``kubernetes``): those that run there."""
    parts = {"hosts": "run_on_hosts", "slurm": "allocation_command", "kubernetes": "pod_command"}
    if target is not None and target not in parts:
        raise ValueError(f"target {target!r} is not one of {list(parts)}")
    return tuple(
        name for name, m in METHODS.items() if target is None or getattr(m, parts[target]) is not None
    )


def get_method(name: str) -> Method:
    """The method called ``name``.

    Raises:
        LaunchError: no such method (the message lists them).
    """
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise LaunchError(
            f"method {name!r} is not one of {list(METHODS)}; use one of them (e.g. 'basic')"
        ) from None
