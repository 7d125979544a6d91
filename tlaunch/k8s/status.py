"""An LPJob's status from its pods, and what makes a job impossible as written (pure: no cluster, no kopf).

The operator (:mod:`tlaunch.k8s.operator`) feeds these the LPJob and its own
pods (those its controller owner reference names) and writes what they return.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tlaunch.k8s.children import LABEL_ROLE

__all__ = ["conditions", "job_status", "refused_status", "same", "spec_error"]


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions(
    phase: str, reason: str, message: str, old: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Conditions with ``phase`` True (its transition time kept if it already was), the others False."""
    before = {c["type"]: c for c in old or []}
    out = []
    for kind in ("Created", "Running", "Restarting", "Succeeded", "Failed"):
        status = "True" if kind == phase else "False"
        prev = before.get(kind)
        since = prev["lastTransitionTime"] if prev and prev.get("status") == status else _now()
        cond = {"type": kind, "status": status, "lastTransitionTime": since}
        if kind == phase:
            cond.update(reason=reason or phase, message=message)
        out.append(cond)
    return out


def job_status(lpjob: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The LPJob's status from its pods' phases (pure; restarts are decided by the caller)."""
    roles: dict[str, dict[str, int]] = {}
    for role in lpjob["spec"]["roles"]:
        roles[role["name"]] = {"total": role["replicas"], "ready": 0, "succeeded": 0, "failed": 0}
    failed: dict[str, Any] | None = None
    for pod in pods:
        counts = roles.get(pod["metadata"].get("labels", {}).get(LABEL_ROLE, ""))
        if counts is None:
            continue
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running":
            counts["ready"] += 1
        elif phase == "Succeeded":
            counts["succeeded"] += 1
        elif phase == "Failed":
            counts["failed"] += 1
            failed = failed or pod
    total = sum(r["total"] for r in roles.values())
    ready = sum(r["ready"] for r in roles.values())
    done = sum(r["succeeded"] for r in roles.values())
    old = lpjob.get("status") or {}
    if failed is not None:
        phase, reason, message = "Failed", "PodFailed", _failure(failed)
    elif done == total:
        phase, reason, message = "Succeeded", "AllSucceeded", f"every pod of the {total} succeeded"
    elif ready + done == total and ready:
        phase, reason, message = "Running", "AllRunning", f"{ready} of {total} pods running"
    elif old.get("phase") == "Restarting":
        phase, reason, message = "Restarting", "PodRestarted", old.get("reason", "")
    else:
        phase, reason, message = "Created", "PodsCreated", f"{ready} of {total} pods running"
    return {
        "phase": phase,
        "reason": message,
        "rolesReady": f"{ready + done}/{total}",
        "restarts": int(old.get("restarts", 0)),
        "roles": roles,
        "conditions": conditions(phase, reason, message, old.get("conditions")),
    }


def _failure(pod: dict[str, Any]) -> str:
    """``pod ppo-trainer-1 failed: exit code 3 (Error)``."""
    text = f"pod {pod['metadata']['name']} failed"
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            text += f": exit code {term.get('exitCode')}"
            if term.get("reason"):
                text += f" ({term['reason']})"
            break
    return text


def refused_status(lpjob: dict[str, Any], reason: str) -> dict[str, Any]:
    """The status of a job the operator refuses to make: ``Failed`` with ``reason``, no pod (pure)."""
    roles = {
        role["name"]: {"total": role["replicas"], "ready": 0, "succeeded": 0, "failed": 0}
        for role in lpjob["spec"]["roles"]
    }
    total = sum(role["replicas"] for role in lpjob["spec"]["roles"])
    old = lpjob.get("status") or {}
    return {
        "phase": "Failed",
        "reason": reason,
        "rolesReady": f"0/{total}",
        "restarts": int(old.get("restarts", 0)),
        "roles": roles,
        "conditions": conditions("Failed", "Refused", reason, old.get("conditions")),
    }


def spec_error(lpjob: dict[str, Any]) -> str | None:
    """What makes a job impossible to make as written (pure), or None."""
    names = [role["name"] for role in lpjob["spec"]["roles"]]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return (
            f"role {twice[0]!r} is named more than once in spec.roles {names}: their pods would have "
            "the same names; give every role a name of its own"
        )
    return None


def same(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether two statuses say the same (transition times aside)."""

    def plain(status: dict[str, Any]) -> dict[str, Any]:
        conds = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions", [])
        ]
        return {**status, "conditions": conds}

    return plain(new) == plain(old)
