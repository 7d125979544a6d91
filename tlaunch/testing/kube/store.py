"""What the stand-in API server holds: the resources it serves, every object, and who watches them.

One ``resourceVersion`` counter for everything, as a real API server has (a
watch resumes from a version), a bounded history of events for those watches,
the pods' logs a test sets, and the refusals a test asks for (RBAC).
"""

from __future__ import annotations

import copy
import queue
import threading
from typing import Any

__all__ = ["Store"]

# (group, version, plural) -> (kind, namespaced, has status subresource)
_BUILTIN: dict[tuple[str, str, str], tuple[str, bool, bool]] = {
    ("", "v1", "pods"): ("Pod", True, True),
    ("", "v1", "services"): ("Service", True, True),
    ("", "v1", "configmaps"): ("ConfigMap", True, False),
    ("", "v1", "secrets"): ("Secret", True, False),
    ("", "v1", "events"): ("Event", True, False),
    ("", "v1", "namespaces"): ("Namespace", False, True),
    ("", "v1", "serviceaccounts"): ("ServiceAccount", True, False),
    ("", "v1", "persistentvolumeclaims"): ("PersistentVolumeClaim", True, True),
    ("", "v1", "resourcequotas"): ("ResourceQuota", True, True),
    ("apps", "v1", "deployments"): ("Deployment", True, True),
    ("scheduling.volcano.sh", "v1beta1", "podgroups"): ("PodGroup", True, True),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): ("CustomResourceDefinition", False, True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"): ("ClusterRole", False, False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"): ("ClusterRoleBinding", False, False),
    ("rbac.authorization.k8s.io", "v1", "roles"): ("Role", True, False),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): ("RoleBinding", True, False),
    ("events.k8s.io", "v1", "events"): ("Event", True, False),
}

_SHORT = {"pods": ["po"], "services": ["svc"], "configmaps": ["cm"], "namespaces": ["ns"],
          "customresourcedefinitions": ["crd", "crds"], "persistentvolumeclaims": ["pvc"],
          "resourcequotas": ["quota"], "deployments": ["deploy"], "serviceaccounts": ["sa"]}  # fmt: skip


class Store:
    """Every object, by (group, plural, namespace, name), with one resourceVersion counter and watchers."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.rv = 1
        self.history: list[tuple[int, str, str, str, dict[str, Any]]] = []  # rv, group, plural, type, obj
        self.watchers: list[tuple[str, str, str | None, queue.Queue[Any]]] = []
        self.resources: dict[tuple[str, str, str], tuple[str, bool, bool]] = dict(_BUILTIN)
        self.logs: dict[tuple[str, str], str] = {}
        self.short_names: dict[str, list[str]] = dict(_SHORT)
        self.refusals: list[tuple[str, str, int, str]] = []  # method, plural, code, reason: refuse()
        self.grants: dict[str, set[str]] = {}  # an impersonated user -> the namespaces it may use: grant()
        self.impersonated: list[tuple[str, str, str, str]] = []  # user, method, plural, namespace

    def bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def emit(self, group: str, plural: str, kind: str, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        snapshot = copy.deepcopy(obj)
        self.history.append((rv, group, plural, kind, snapshot))
        del self.history[:-5000]
        ns = obj["metadata"].get("namespace")
        for g, p, wns, q in list(self.watchers):
            if g == group and p == plural and (wns is None or wns == ns):
                q.put((kind, snapshot))
