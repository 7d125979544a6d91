"""Each group's pods, with the original TLaunch's ``lp_k8s`` names: ``group_config={label: Config(...)}``.

::

    from tlaunch.lp_k8s import Config, Container, Resource, ResourceRange

    group_config = {
        "learner": Config(
            container=Container(
                image="repo/learner:1",
                resources=Resource(cpu="4", memory=ResourceRange("8Gi", "16Gi"), nvidia_gpu=1),
                env={"NCCL_DEBUG": "WARN"},
                flags=["--batch_size=256"],
            ),
            node_selector={"gpu": "a100"},
            tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        ),
        "actor": Config(container=Container(resources=Resource(cpu=ResourceRange("1", "2"), memory="2Gi"))),
    }

What becomes of each part (``docs/k8s.md`` has the table): the image and the
resources go into the group's role of the LPJob (the operator puts them on
every pod of the group); GPUs follow the launch's ``gpu_stack`` as
``tlaunchrun``'s do (``nvidia_gpu_memory`` and ``nvidia_gpu_cores`` are vGPU
shares: HAMi or Volcano); the environment and the flags travel with each
node's file in the run's Secret (never in the pod's spec); pod fields are the
scheduling fields of :data:`~tlaunch.k8s.crd.POD_FIELDS`, in the original's
snake_case (``node_selector``) or the API's camelCase (``nodeSelector``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tlaunch.errors import LaunchError
from tlaunch.extras import require
from tlaunch.flags import flag_values
from tlaunch.k8s.crd import POD_FIELDS, QUANTITY

__all__ = ["Amount", "Config", "Container", "Resource", "ResourceRange", "pod_command"]

ENTRY = ["python", "-m", "tlaunch.k8s.pod", "node"]
"""What a node's pod runs (:mod:`tlaunch.k8s.pod`)."""
_QUANTITY = re.compile(QUANTITY)
_SNAKE = {re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower(): name for name in POD_FIELDS}
_REFUSED = {
    "namespace": "a run's pods share its namespace: lp_k8s.launch(..., namespace=...)",
    "containers": "a group's pod has one container: Config(container=Container(...))",
    "restart_policy": "restarts are the run's: launch(..., max_restarts=N)",
}


class ResourceRange(NamedTuple):
    """A request and a limit: ``ResourceRange("1", "2")`` asks for 1 CPU and allows 2 (None: not set)."""

    requests: str | int | float | None
    limits: str | int | float | None


Amount = ResourceRange | tuple[str | int | float | None, str | int | float | None] | str | int | float | None
"""A CPU or memory amount: a request (``"2"``, ``"4Gi"``), or a (request, limit) pair."""


@dataclass(frozen=True)
class Resource:
    """What each pod of a group asks of its node.

    Attributes:
        cpu: CPUs: a request (``"2"``, ``"500m"``), or ``ResourceRange(request, limit)``.
        memory: memory, the same way (``"4Gi"``, ``ResourceRange("4Gi", "8Gi")``).
        nvidia_gpu: GPUs per pod (a whole number; a GPU's request is its limit).
        nvidia_gpu_memory: MiB of each GPU (vGPU: a share of its memory).
        nvidia_gpu_cores: percent of each GPU's cores, 1 to 100 (vGPU).
    """

    cpu: Amount = None
    memory: Amount = None
    nvidia_gpu: int | str | ResourceRange | None = None
    nvidia_gpu_memory: int | None = None
    nvidia_gpu_cores: int | None = None

    def role_resources(self, label: str) -> dict[str, Any]:
        """The ``resources`` of group ``label``'s role in the LPJob.

        Raises:
            LaunchError: a value Kubernetes or the vGPU stack would refuse, named with the fix.
        """
        out: dict[str, Any] = {}
        for name in ("cpu", "memory"):
            request, limit = _amounts(label, name, getattr(self, name))
            if request is not None:
                out[name] = request
            if limit is not None:
                out[f"{name}Limit"] = limit
        gpus = _gpus(label, self.nvidia_gpu)
        if gpus:
            out["gpu"] = gpus
        for name, key, low, high in (
            ("nvidia_gpu_memory", "gpuMemory", 1, 1 << 30),
            ("nvidia_gpu_cores", "gpuCores", 1, 100),
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise LaunchError(
                    f"group {label!r}: Resource({name}={value!r}) must be a whole number from {low} to {high}"
                )
            if not gpus:
                raise LaunchError(
                    f"group {label!r}: Resource({name}=...) is a share of each GPU; give nvidia_gpu= with it"
                )
            out[key] = value
        return out


@dataclass(frozen=True)
class Container:
    """The container of each pod of a group.

    Attributes:
        image: its image (default: the launch's ``image``).
        command: what it runs instead of ``python -m tlaunch.k8s.pod node``; it must
            still start the node that way (``["bash", "-c", "pip install x && exec
            python -m tlaunch.k8s.pod node"]``).
        flags: absl flags of the group's nodes, beside the launcher's: ``["--lr=0.1"]``
            or ``{"lr": 0.1}``.
        resources: what each pod asks of its node.
        env: environment variables of the group's nodes.
    """

    image: str | None = None
    command: Sequence[str] | None = None
    flags: Sequence[str] | Mapping[str, Any] = ()
    resources: Resource | None = None
    env: Mapping[str, str] | None = None


@dataclass(frozen=True, init=False)
class Config:
    """A group's pods: ``Config(container=Container(...), node_selector=..., tolerations=...)``.

    A pod field that is not a scheduling field tlaunch passes on, or a container
    that is not a :class:`Container`, raises :class:`LaunchError` (naming the
    fields that are).

    Attributes:
        container: the pods' container.
        pod: the pod fields given (camelCase), of :data:`~tlaunch.k8s.crd.POD_FIELDS`.
    """

    container: Container = field(default_factory=Container)
    pod: Mapping[str, Any] = field(default_factory=dict)

    def __init__(self, container: Container | None = None, **pod_fields: Any) -> None:
        if container is not None and not isinstance(container, Container):
            raise LaunchError(f"Config(container={container!r}) must be an lp_k8s.Container(...)")
        object.__setattr__(self, "container", container or Container())
        object.__setattr__(self, "pod", _pod_fields(pod_fields))

    def role(self, label: str, image: str | None) -> dict[str, Any]:
        """The fields of group ``label``'s role in the LPJob (``image``: the launch's default).

        Raises:
            LaunchError: the group has no image, or a bad resource or command.
        """
        c = self.container
        role: dict[str, Any] = {"image": _image(label, c.image or image)}
        if c.resources is not None:
            if not isinstance(c.resources, Resource):
                raise LaunchError(
                    f"group {label!r}: Container(resources=...) must be an lp_k8s.Resource(...)"
                )
            resources = c.resources.role_resources(label)
            if resources:
                role["resources"] = resources
        if self.pod:
            role["pod"] = dict(self.pod)
        role["command"] = pod_command(label, c.command)
        return role

    def node_env(self, label: str) -> dict[str, str]:
        """The environment variables of group ``label``'s nodes.

        Raises:
            LaunchError: names or values that are not strings.
        """
        env = self.container.env or {}
        if not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
            raise LaunchError(f"group {label!r}: Container(env=...) must map names to values")
        return {k: str(v) for k, v in env.items()}

    def node_flags(self, label: str) -> dict[str, tuple[str, Any]]:
        """The absl flags of group ``label``'s nodes, as nodes restore them.

        Raises:
            LaunchError: a flag that is not ``--name=value``, ``--name`` or ``--noname``.
        """
        try:
            return flag_values(self.container.flags)
        except ValueError as exc:
            raise LaunchError(f"group {label!r}: Container(flags=...): {exc}") from None


def pod_command(label: str, command: Sequence[str] | None) -> list[str]:
    """The command of group ``label``'s pods: the node's entry point, or a command that starts it.

    Raises:
        LaunchError: a command that does not start ``python -m tlaunch.k8s.pod node``.
    """
    if command is None:
        return list(ENTRY)
    if isinstance(command, str) or not all(isinstance(a, str) for a in command):
        raise LaunchError(f"group {label!r}: Container(command={command!r}) must be a list of strings")
    if not any("tlaunch.k8s.pod" in a for a in command):
        raise LaunchError(
            f"group {label!r}: Container(command={list(command)!r}) does not start the node: it must run "
            "`python -m tlaunch.k8s.pod node` (e.g. ['bash', '-c', 'pip install x && exec python -m "
            "tlaunch.k8s.pod node']), or leave command out"
        )
    return list(command)


def _image(label: str, image: str | None) -> str:
    if not image:
        raise LaunchError(
            f"group {label!r} has no image: pass launch(..., image='repo/img:1') for every group, or "
            f"group_config={{{label!r}: Config(container=Container(image=...))}}"
        )
    if not isinstance(image, str) or any(c.isspace() for c in image):
        raise LaunchError(f"group {label!r}: image={image!r} is not an image reference (e.g. 'repo/img:1')")
    return image


def _amounts(label: str, name: str, value: Amount) -> tuple[str | None, str | None]:
    """(request, limit) of a CPU or memory amount, each checked as a Kubernetes quantity."""
    if value is None:
        return None, None
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, None)
    if len(pair) != 2:
        raise LaunchError(
            f"group {label!r}: Resource({name}={value!r}) must be an amount or (request, limit)"
        )
    out: list[str | None] = []
    for part in pair:
        if part is None:
            out.append(None)
            continue
        text = str(part)
        if isinstance(part, bool) or not _QUANTITY.match(text):
            raise LaunchError(
                f"group {label!r}: Resource({name}={value!r}): {part!r} is not a Kubernetes quantity; "
                "write e.g. '500m', '2', '4Gi'"
            )
        out.append(text)
    return out[0], out[1]


def _gpus(label: str, gpus: int | str | ResourceRange | None) -> int:
    """A whole number of GPUs (a range only where its request and limit agree)."""
    value: object = gpus
    if isinstance(gpus, (tuple, list)):
        given = {v for v in gpus if v is not None}
        if len(given) != 1:
            raise LaunchError(
                f"group {label!r}: Resource(nvidia_gpu={value!r}): a GPU's request is its limit; "
                "give one number"
            )
        value = given.pop()
    if value is None:
        return 0
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or int(text) > 64:
        raise LaunchError(
            f"group {label!r}: Resource(nvidia_gpu={value!r}) must be a whole number from 0 to 64"
        )
    return int(text)


def _pod_fields(given: Mapping[str, Any]) -> dict[str, Any]:
    """The pod fields of a Config, camelCase, as plain JSON values."""
    out: dict[str, Any] = {}
    for name, value in given.items():
        key = name if name in POD_FIELDS else _SNAKE.get(name)
        if key is None:
            why = _REFUSED.get(name, "it is not a scheduling field tlaunch passes on to the group's pods")
            raise LaunchError(
                f"Config({name}=...) is not supported: {why}; the pod fields are "
                f"{sorted(_SNAKE)} (or camelCase: {list(POD_FIELDS)})"
            )
        out[key] = value
    try:
        json.dumps(out)
    except TypeError:  # kubernetes model objects (V1Toleration...): as the API writes them
        kubernetes = require("kubernetes", "lp_k8s.Config with kubernetes model objects")
        out = kubernetes.client.ApiClient().sanitize_for_serialization(out)
    if not isinstance(out.get("nodeSelector", {}), Mapping) or not all(
        isinstance(v, str) for v in out.get("nodeSelector", {}).values()
    ):
        raise LaunchError(f"Config(node_selector={out['nodeSelector']!r}) must map label names to values")
    for key in ("tolerations", "topologySpreadConstraints", "imagePullSecrets"):
        if key in out and (isinstance(out[key], (str, Mapping)) or not isinstance(out[key], Sequence)):
            raise LaunchError(f"Config({key}={out[key]!r}) must be a list")
    return out
