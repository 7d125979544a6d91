"""What a Launchpad program becomes on Kubernetes (pure): its LPJob, its pods' names, its run's Secret.

The LPJob's first role is the run's coordinator (one pod, ``python -m
tlaunch.k8s.pod head``), then one role per group of the program, one pod per
node (``<job>-<role>-<i>``: ``consumer``, ``producer`` x 3...), each with its
group's image, resources and pod fields. The Secret ``tlaunch-run-<job>``
(:func:`~tlaunch.k8s.children.run_secret_name`, mounted by ``runFiles``) holds the
run's files, built by :class:`~tlaunch.backends.base.RunSpec` as for every
backend: the coordinator's, and one per node (the node, pickled with the
user's own modules by value, and the run's TLS keys); pods mount it read-only.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from tlaunch.k8s.children import run_secret_name
from tlaunch.k8s.crd import GROUP, KIND, VERSION
from tlaunch.plan import LaunchPlan

__all__ = [
    "COORDINATOR_ROLE",
    "LABEL_RUN_ID",
    "SECRET_LIMIT",
    "coordinator_address",
    "job_name",
    "lpjob",
    "pod_names",
    "roles",
    "run_id_label",
    "run_secret",
]

COORDINATOR_ROLE = "coordinator"
LABEL_RUN_ID = f"{GROUP}/run-id"
SECRET_LIMIT = 1 << 20
"""The API server's limit on a Secret."""


def job_name(program_name: str, run_id: str) -> str:
    """The LPJob's name: the program's name as a DNS label (30 characters), and the run id's end."""
    base = re.sub(r"[^a-z0-9-]+", "-", program_name.lower()).strip("-")[:30].strip("-") or "program"
    return f"{base}-{run_id.rsplit('-', 1)[-1]}"


def run_id_label(run_id: str) -> str:
    """The run id as a label value (63 characters, starting and ending with a letter or digit)."""
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", run_id[-63:])


def roles(plan: LaunchPlan) -> dict[str, str]:
    """The role (a DNS label, at most 16 characters) of each group label of ``plan``, in order."""
    taken = {COORDINATOR_ROLE}
    out: dict[str, str] = {}
    for node in plan.nodes:
        if node.label in out:
            continue
        name = re.sub(r"[^a-z0-9-]+", "-", node.label.lower()).strip("-")[:16].strip("-") or "group"
        while name in taken:
            name = f"{name[:13].strip('-')}-{len(taken)}"
        taken.add(name)
        out[node.label] = name
    return out


def pod_names(job: str, plan: LaunchPlan) -> dict[str, str]:
    """Each node's pod: ``<job>-<role>-<index>``."""
    role_of = roles(plan)
    return {n.key: f"{job}-{role_of[n.label]}-{n.index}" for n in plan.nodes}


def coordinator_address(job: str, namespace: str, port: int) -> str:
    """Where nodes reach the coordinator: its pod's stable name in the job's headless service."""
    return f"{job}-{COORDINATOR_ROLE}-0.{job}.{namespace}.svc:{port}"


def lpjob(
    name: str,
    namespace: str,
    plan: LaunchPlan,
    *,
    image: str,
    pull_policy: str,
    port: int,
    gpu_stack: str,
    group_roles: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The LPJob of a program run (``group_roles``: each group's image, command, resources, pod fields)."""
    coordinator = coordinator_address(name, namespace, port)
    role_of = roles(plan)
    out = [
        {
            "name": COORDINATOR_ROLE,
            "replicas": 1,
            "command": ["python", "-m", "tlaunch.k8s.pod", "head"],
            "env": [{"name": "TLAUNCH_COORDINATOR_PORT", "value": str(port)}],
        }
    ]
    counts: dict[str, int] = {}
    for node in plan.nodes:
        counts[node.label] = counts.get(node.label, 0) + 1
    for label, count in counts.items():
        env = [
            {"name": "TLAUNCH_GROUP", "value": label},
            {"name": "TLAUNCH_COORDINATOR", "value": coordinator},
        ]
        out.append({"name": role_of[label], "replicas": count, **group_roles[label], "env": env})
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_RUN_ID: run_id_label(plan.run_id)},
        },
        "spec": {
            "image": image,
            "imagePullPolicy": pull_policy,
            "launcher": "command",  # each pod runs its node as it is (no rank arguments)
            "gpuStack": gpu_stack,
            "gangScheduling": False,
            "restartPolicy": "Never",  # restarts are the run's own (its supervisors)
            "backoffLimit": 0,
            "roles": out,
            "runFiles": True,  # the operator mounts the job's own run Secret
        },
    }


def run_secret(name: str, namespace: str, files: Mapping[str, bytes]) -> dict[str, Any]:
    """The Secret of the run's files (the pods mount it read-only)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": run_secret_name(name),
            "namespace": namespace,
            "labels": {f"{GROUP}/job": name},
        },
        "type": "Opaque",
        "data": {key: base64.b64encode(value).decode() for key, value in files.items()},
    }
