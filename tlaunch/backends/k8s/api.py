"""One LPJob through the Kubernetes API: the job, its pods, their logs; delete.

Answers are the API's JSON (dicts), so that :mod:`tlaunch.backends.k8s.observe`
reads them purely. A pod counts as the job's only when its controller owner
reference carries the LPJob's uid: a foreign pod with the job's label is not
the job's.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.extras import require
from tlaunch.k8s.children import LABEL_JOB
from tlaunch.k8s.client import Kube
from tlaunch.k8s.crd import GROUP, PLURAL, VERSION

__all__ = ["JobAPI", "errors_of"]


def errors_of(kube: Kube) -> tuple[type[BaseException], ...]:
    """What a call through ``kube`` raises when the cluster refuses or cannot be reached."""
    urllib3 = require("urllib3", "Kubernetes")
    return (kube.ApiException, OSError, urllib3.exceptions.HTTPError)


class JobAPI:
    """LPJob ``namespace/name`` on the cluster of ``kube``.

    Attributes:
        errors: what a call may raise when the cluster refuses or cannot be reached.
    """

    def __init__(self, kube: Kube, name: str, namespace: str) -> None:
        self.kube = kube
        self.name = name
        self.namespace = namespace
        self.errors = errors_of(kube)

    def job(self) -> dict[str, Any] | None:
        """The LPJob, or None if there is none."""
        try:
            found = self.kube.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
        except self.kube.ApiException as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise
        return dict(found)

    def pods(self, job: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The job's pods (those it controls, when ``job`` is known), as the API writes them."""
        found = self.kube.core.list_namespaced_pod(self.namespace, label_selector=f"{LABEL_JOB}={self.name}")
        pods = [self.kube.api.sanitize_for_serialization(p) for p in found.items]
        uid = ((job or {}).get("metadata") or {}).get("uid")
        if uid is None:
            return list(pods)
        return [p for p in pods if _controller(p) == uid]

    def log(self, pod: str) -> str:
        """What pod ``pod`` has printed so far ("" before it starts and after it is gone)."""
        try:
            return str(self.kube.core.read_namespaced_pod_log(pod, self.namespace) or "")
        except self.kube.ApiException as exc:
            if getattr(exc, "status", None) in (400, 404):  # waiting to start, or gone
                return ""
            raise

    def delete(self) -> bool:
        """Delete the LPJob (the operator deletes its pods; its Secret goes with it); False if it was gone.

        Raises:
            LaunchError: the cluster refused, or cannot be reached.
        """
        try:
            self.kube.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
        except self.kube.ApiException as exc:
            if getattr(exc, "status", None) == 404:
                return False
            raise self.kube.refused(f"cannot delete LPJob {self.namespace}/{self.name}", exc) from None
        except self.errors as exc:
            raise LaunchError(
                f"cannot reach the cluster to delete LPJob {self.namespace}/{self.name}: {exc}"
            ) from None
        return True

    def delete_secret(self, name: str) -> None:
        """Delete Secret ``name``, if it is there and the cluster answers (else nothing more can be done)."""
        with contextlib.suppress(*self.errors):
            self.kube.core.delete_namespaced_secret(name, self.namespace)


def _controller(pod: dict[str, Any]) -> str | None:
    """The uid of the pod's controller (None: no controller reference)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None
