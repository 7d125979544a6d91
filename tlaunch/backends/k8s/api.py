"""One LPJob through the Kubernetes API: the job, its pods, their logs; delete.

Answers are the API's JSON (dicts), so that :mod:`tlaunch.backends.k8s.observe`
reads them purely; every refusal or unreachable cluster is a
:class:`~tlaunch.errors.LaunchError` saying what was asked. A pod counts as
the job's only when its controller owner reference carries the LPJob's uid:
a foreign pod with the job's label is not the job's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.extras import require
from tlaunch.k8s.children import LABEL_JOB
from tlaunch.k8s.client import Kube
from tlaunch.k8s.crd import GROUP, PLURAL, VERSION

__all__ = [
    "JobAPI",
    "NOT_INSTALLED",
    "asking",
    "errors_of",
]


def errors_of(kube: Kube) -> tuple[type[BaseException], ...]:
    """What a call through ``kube`` raises when the cluster refuses or cannot be reached."""
    urllib3 = require("urllib3", "Kubernetes")
    return (kube.ApiException, OSError, urllib3.exceptions.HTTPError)


NOT_INSTALLED = (
    "does the namespace exist, and is the LPJob resource installed? "
    "(tlaunch k8s manifests | kubectl apply -f -)"
)
"""What a 404 on creating an LPJob most likely means."""


@contextlib.contextmanager
def asking(kube: Kube, what: str, absent: tuple[int, ...] = (), if_missing: str = "") -> Iterator[None]:
    """Turn the errors of the calls in the block into a :class:`LaunchError` about ``what``.

    An answer whose status is in ``absent`` (404: not there) leaves the block
    quietly: the caller's default stands. ``if_missing`` is added to the message
    of another 404 (what to check).
    """
    try:
        yield
    except kube.ApiException as exc:
        status = getattr(exc, "status", None)
        if status in absent:
            return
        raise kube.refused(what + (f" ({if_missing})" if status == 404 and if_missing else ""), exc) from None
    except errors_of(kube) as exc:
        raise LaunchError(f"{what}: cannot reach the cluster ({kube.source}): {exc}") from None


class JobAPI:
    """LPJob ``namespace/name`` on the cluster of ``kube``; every call may raise :class:`LaunchError`."""

    def __init__(self, kube: Kube, name: str, namespace: str) -> None:
        self.kube = kube
        self.name = name
        self.namespace = namespace

    def job(self) -> dict[str, Any] | None:
        """The LPJob, or None if there is none."""
        found = None
        with asking(self.kube, f"cannot read LPJob {self.namespace}/{self.name}", absent=(404,)):
            found = self.kube.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
        return None if found is None else dict(found)

    def pods(self, job: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The job's pods (those it controls, when ``job`` is known), as the API writes them."""
        with asking(self.kube, f"cannot list the pods of LPJob {self.namespace}/{self.name}"):
            found = self.kube.core.list_namespaced_pod(
                self.namespace, label_selector=f"{LABEL_JOB}={self.name}"
            )
        pods = [self.kube.api.sanitize_for_serialization(p) for p in found.items]
        uid = ((job or {}).get("metadata") or {}).get("uid")
        if uid is None:
            return list(pods)
        return [p for p in pods if _controller(p) == uid]

    def log(self, pod: str) -> str:
        """What pod ``pod`` has printed so far ("" before it starts and after it is gone)."""
        text = ""
        with asking(self.kube, f"cannot read the log of pod {self.namespace}/{pod}", absent=(400, 404)):
            text = str(self.kube.core.read_namespaced_pod_log(pod, self.namespace) or "")
        return text

    def delete(self) -> bool:
        """Delete the LPJob (the operator deletes its pods; its Secret goes with it); False if it was gone."""
        deleted = False
        with asking(self.kube, f"cannot delete LPJob {self.namespace}/{self.name}", absent=(404,)):
            self.kube.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name
            )
            deleted = True
        return deleted

    def delete_secret(self, name: str) -> None:
        """Delete Secret ``name``, if it is there and the cluster answers (else nothing more can be done)."""
        with contextlib.suppress(*errors_of(self.kube)):
            self.kube.core.delete_namespaced_secret(name, self.namespace)


def _controller(pod: dict[str, Any]) -> str | None:
    """The uid of the pod's controller (None: no controller reference)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None
