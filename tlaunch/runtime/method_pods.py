"""How a launch method runs in pods: its command around the trainer's, its files, its LPJob section (pure).

An LPJob (:mod:`tlaunch.k8s.crd`) names its method (``spec.launcher``) and may
carry the method's own section (``spec.torchrun``, ``spec.deepspeed``); the
operator (:mod:`tlaunch.k8s.children`) asks the method's :class:`PodSide` for
each pod's command and for the files every pod gets. A section's keys, their
schema (the CRD's) and their defaults are stated once, in :class:`SectionKey`:
the LPJob a :class:`~tlaunch.jobs.JobSpec` becomes writes them from the job's
settings, and a pod's command reads them with the defaults filled in.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RDZV_PORT",
    "TORCH_MASTER_PORT",
    "PodSide",
    "Pods",
    "SectionKey",
    "basic_pod",
    "deepspeed_files",
    "deepspeed_pod",
    "path_arguments",
    "python_script",
    "rank_arguments",
    "torchrun_pod",
    "trainer_pod",
]

TORCH_MASTER_PORT = 29500
"""Rank 0's port in a pod (``MASTER_PORT``; DeepSpeed's default; the job's service exposes it)."""
RDZV_PORT = 29400
"""torchrun's c10d rendezvous port on the first pod (the job's service exposes it)."""


@dataclass(frozen=True)
class Pods:
    """A job's pods as its method sees them (:mod:`tlaunch.k8s.children` fills this in from the LPJob).

    Attributes:
        job: the LPJob's name.
        hosts: each trainer pod's stable DNS name, by index (the first hosts rendezvous).
        settings: the method's own section of the LPJob (``spec.torchrun``...), every key of it
            there (its default where the LPJob has none).
        share_file: the job's shared file (``spec.shareFile``), or None.
    """

    job: str
    hosts: tuple[str, ...]
    settings: Mapping[str, Any]
    share_file: str | None = None


@dataclass(frozen=True)
class SectionKey:
    """A key of a method's LPJob section.

    Attributes:
        key: its name in the section (``nprocPerNode``).
        schema: its JSON schema (the CRD's).
        setting: the job setting it is written from (None: only LPJobs written by hand set it).
        default: its value when the LPJob has none: a value, or a function of the pod count.
    """

    key: str
    schema: Mapping[str, Any]
    setting: str | None
    default: object

    def default_for(self, pods: int) -> object:
        """The default in a job of ``pods`` pods."""
        return self.default(pods) if callable(self.default) else self.default


@dataclass(frozen=True)
class PodSide:
    """How a method runs on Kubernetes.

    Attributes:
        command: each pod's command, given the pods, the pod's index and the trainer's own command.
        files: files every pod gets in ``/etc/tlaunch`` (a ConfigMap), by name (None: none).
        section: the keys of its LPJob section (``spec.<method>``); empty: it has none.
        role_command: the role's command in the LPJob, from the job's script.
    """

    command: Callable[[Pods, int, list[str]], list[str]]
    files: Callable[[Pods], dict[str, str]] | None = None
    section: tuple[SectionKey, ...] = ()
    role_command: Callable[[Sequence[str]], list[str]] = list

    def section_of(self, settings: Mapping[str, object], pods: int) -> dict[str, Any]:
        """The section of the LPJob of a job of ``pods`` pods whose settings are ``settings`` (by name):
        each key written from its setting."""
        out = {}
        for key in self.section:
            if key.setting is not None:
                value = settings.get(key.setting)
                out[key.key] = key.default_for(pods) if value is None else value
        return out

    def settings_of(self, given: Mapping[str, Any], pods: int) -> dict[str, Any]:
        """Every key of the section, from ``given`` (an LPJob's section) or its default."""
        return {k.key: given.get(k.key, k.default_for(pods)) for k in self.section}

    def schema(self) -> dict[str, Any]:
        """The section's JSON schema (the CRD's ``spec.<method>``)."""
        return {"type": "object", "properties": {k.key: dict(k.schema) for k in self.section}}


def python_script(script: Sequence[str]) -> list[str]:
    """A job's script as a pod's command: a ``.py`` file runs with ``python``."""
    return ["python", *script] if script and script[0].endswith(".py") else list(script)


def path_arguments(save_path: str | None, checkpoint_path: str | None) -> list[str]:
    """What a job's trainers get after their own arguments with ``set_save_path`` and
    ``set_checkpoint_path`` (the seed's ``--save_path``, ``--checkpoint_path``), before a basic
    trainer's :func:`rank_arguments`: on every target (hosts and SLURM:
    :mod:`tlaunch.control.starting.runners`; a pod: :mod:`tlaunch.k8s.children`)."""
    save = ["--save_path", save_path] if save_path else []
    return [*save, *(["--checkpoint_path", checkpoint_path] if checkpoint_path else [])]


def rank_arguments(rank: int, world_size: int, share_file: str | None) -> list[str]:
    """What a basic trainer's script gets after its own arguments, as in the original TLaunch's basic mode.

    ``--rank R --world_size N``, and ``--share_file F`` with a shared file: on every
    target (hosts and SLURM: :mod:`tlaunch.torch.trainer`; a pod: :func:`basic_pod`).
    """
    share = ["--share_file", share_file] if share_file else []
    return ["--rank", str(rank), "--world_size", str(world_size), *share]


def basic_pod(pods: Pods, index: int, user: list[str]) -> list[str]:
    """The trainer's command and its :func:`rank_arguments` (its section's ``rankArgs: false``: none)."""
    if not pods.settings.get("rankArgs", True):
        return user
    return [*user, *rank_arguments(index, len(pods.hosts), pods.share_file)]


def trainer_pod(pods: Pods, index: int, user: list[str]) -> list[str]:
    """The trainer's own command (any program): its rank is in its environment."""
    return user


def torchrun_pod(pods: Pods, index: int, user: list[str]) -> list[str]:
    """torch's elastic agent in every pod, c10d rendezvous on the first."""
    s = pods.settings
    return [
        "torchrun",
        f"--nnodes={s['nnodes']}",
        f"--nproc-per-node={s['nprocPerNode']}",
        f"--max-restarts={s['maxRestarts']}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={pods.hosts[0]}:{s['rdzvPort']}",
        f"--rdzv-id={pods.job}",
        *user,
    ]


def deepspeed_pod(pods: Pods, index: int, user: list[str]) -> list[str]:
    """DeepSpeed's per-node launcher in every pod, with the job's world."""
    slots = int(pods.settings["slotsPerNode"])
    world = {host: list(range(slots)) for host in pods.hosts}
    info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    return [
        "python",
        "-m",
        "deepspeed.launcher.launch",
        f"--world_info={info}",
        f"--node_rank={index}",
        f"--master_addr={pods.hosts[0]}",
        f"--master_port={pods.settings['masterPort']}",
        *user,
    ]


def deepspeed_files(pods: Pods) -> dict[str, str]:
    """DeepSpeed's hostfile: every pod with its slots."""
    slots = int(pods.settings["slotsPerNode"])
    return {"hostfile": "".join(f"{host} slots={slots}\n" for host in pods.hosts)}
