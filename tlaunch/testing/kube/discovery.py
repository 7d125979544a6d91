"""What the stand-in API server says of itself, and ``kubectl get``'s tables of what it holds (pure).

The discovery documents (``/version``, ``/api``, ``/apis``, each group version's
resources) that clients read before anything else, and the ``Table`` view
``kubectl get`` asks for (``Accept: ...;as=Table``); :mod:`.http` sends them.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

__all__ = ["discovery", "table"]


def discovery(store: Any, path: str) -> dict[str, Any] | None:
    """The discovery document at ``path`` (``/version``, ``/api``, ``/apis``, a group version's
    resources) of what ``store`` serves; None where ``path`` is no discovery path.

    Raises:
        LookupError: a group version the store does not serve.
    """
    if path == "/version":
        return {
            "major": "1",
            "minor": "32",
            "gitVersion": "v1.32.0-tlaunch-standin",
            "platform": "linux/amd64",
        }
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups: dict[str, list[str]] = {}
        for g, v, _ in store.resources:
            if g:
                groups.setdefault(g, [])
                if v not in groups[g]:
                    groups[g].append(v)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in sorted(groups.items())
            ],
        }
    if path != "/api/v1" and not re.match(r"^/apis/[^/]+/[^/]+$", path):
        return None
    group, version = ("", "v1") if path == "/api/v1" else tuple(path.split("/")[2:4])
    resources = []
    for (g, v, plural), (kind, namespaced, status) in sorted(store.resources.items()):
        if (g, v) != (group, version):
            continue
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resources.append(
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": verbs,
                "shortNames": store.short_names.get(plural, []),
            }
        )
        if status:
            resources.append(
                {
                    "name": f"{plural}/status",
                    "singularName": "",
                    "namespaced": namespaced,
                    "kind": kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if plural == "pods":
            for sub, verbs in (("log", ["get"]), ("portforward", ["create", "get"])):
                resources.append(
                    {
                        "name": f"pods/{sub}",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "PodPortForwardOptions" if sub == "portforward" else "Pod",
                        "verbs": verbs,
                    }
                )
    if not resources:
        raise LookupError(f"no group version {group}/{version}")
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def table(crds: list[dict[str, Any]], group: str, plural: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """``kubectl get``'s table of ``items``: the printer columns of their custom resource's CRD (one
    of ``crds``), else name and age."""
    columns = [{"name": "Name", "type": "string", "format": "name"}]
    paths: list[str] = []
    for crd in crds:
        spec = crd["spec"]
        if spec["group"] == group and spec["names"]["plural"] == plural:
            for col in spec["versions"][0].get("additionalPrinterColumns", []):
                columns.append({"name": col["name"], "type": col["type"], "format": ""})
                paths.append(col["jsonPath"])
    if not paths:
        columns.append({"name": "Age", "type": "date", "format": ""})
        paths.append(".metadata.creationTimestamp")
    rows = []
    for obj in items:
        cells: list[Any] = [obj["metadata"]["name"]]
        for p in paths:
            value: Any = obj
            for part in p.strip(".").split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if p.endswith("creationTimestamp") and isinstance(value, str):
                made = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
                value = f"{int((datetime.now(timezone.utc) - made).total_seconds())}s"
            cells.append(value if value is not None else "")
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                },
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": columns,
        "rows": rows,
    }
