"""The options of Kubernetes launches (keyword arguments of :func:`tlaunch.launch`, ``launch_type="k8s"``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tlaunch.backends.base import BackendOptions
from tlaunch.backends.k8s.groups import Config
from tlaunch.errors import LaunchError
from tlaunch.k8s.crd import GPU_STACKS, PULL_POLICIES

__all__ = ["COORDINATOR_PORT", "K8sOptions"]

COORDINATOR_PORT = 7070
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class K8sOptions(BackendOptions):
    """Options of Kubernetes launches, beside the common ones (:class:`~tlaunch.options.LaunchOptions`).

    Attributes:
        image: the image of every pod whose group names none in ``group_config``, and of the
            coordinator's pod (tlaunch installed, at the launcher's Python minor version).
        namespace: the run's namespace (default: the credentials' own, in a pod its service
            account's, else the kubeconfig context's, else ``default``:
            :func:`tlaunch.k8s.client.namespace_of`).
        kube_config: a kubeconfig file (default: ``$KUBECONFIG``, the pod's service account,
            ``~/.kube/config``: :mod:`tlaunch.k8s.client`).
        image_pull_policy: ``Always``, ``IfNotPresent`` or ``Never``.
        group_config: a :class:`~tlaunch.backends.k8s.groups.Config` per group label: the
            group's image, command, flags, resources, environment and pod fields.
        gpu_stack: the cluster's vGPU stack: ``hami`` (``nvidia.com/gpu``, ``gpumem``,
            ``gpucores``) or ``volcano`` (``volcano.sh/vgpu-number``, ``-memory``, ``-cores``).
        coordinator_port: the port of the run's coordinator in its pod.
    """

    image: str | None = None
    namespace: str | None = None
    kube_config: str | None = None
    image_pull_policy: str = "IfNotPresent"
    group_config: Mapping[str, Config] = field(default_factory=dict)
    gpu_stack: str = "hami"
    coordinator_port: int = COORDINATOR_PORT

    def check(self) -> None:
        if self.image is not None and (
            not isinstance(self.image, str) or not self.image or any(c.isspace() for c in self.image)
        ):
            raise LaunchError(f"image={self.image!r} is not an image reference (e.g. 'repo/trainer:1')")
        if self.namespace is not None and (
            not isinstance(self.namespace, str) or not _NAME.match(self.namespace) or len(self.namespace) > 63
        ):
            raise LaunchError(
                f"namespace={self.namespace!r} is not a Kubernetes namespace name (e.g. 'team-rl')"
            )
        if self.kube_config is not None and not isinstance(self.kube_config, str):
            raise LaunchError(f"kube_config={self.kube_config!r} must be the path of a kubeconfig file")
        if self.image_pull_policy not in PULL_POLICIES:
            raise LaunchError(
                f"image_pull_policy={self.image_pull_policy!r} is not one of {list(PULL_POLICIES)}"
            )
        if self.gpu_stack not in GPU_STACKS:
            raise LaunchError(f"gpu_stack={self.gpu_stack!r} is not one of {list(GPU_STACKS)}")
        port = self.coordinator_port
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise LaunchError(f"coordinator_port={port!r} must be a port number, 1 to 65535")
        if not isinstance(self.group_config, Mapping):
            raise LaunchError(
                f"group_config={self.group_config!r} must map group labels to lp_k8s.Config(...), "
                "e.g. {'learner': Config(container=Container(image='repo/learner:1'))}"
            )
        bad = sorted(str(k) for k, v in self.group_config.items() if not isinstance(v, Config))
        if bad:
            raise LaunchError(
                f"group_config {bad} are not lp_k8s.Config objects: give "
                "group_config={'label': Config(container=Container(image=..., resources=Resource(...)))}"
            )
