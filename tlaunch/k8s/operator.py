"""The LPJob operator (kopf): an LPJob becomes its pods and service; their phases become its status.

Run it in a cluster with the Deployment of ``tlaunch k8s manifests``, or by
hand: ``python -m tlaunch.k8s.operator`` (``kopf run`` underneath; every
namespace, or ``--namespace NS``). Needs ``pip install 'tlaunch[k8s]'``.

* **create**: the children of :func:`tlaunch.k8s.children.children` (headless
  service, hostfile ConfigMap, Volcano PodGroup, a pod per replica), each
  owned by the LPJob; status ``Created`` with every role's replica count.
* **pod events** (pods labelled ``tlaunch.io/job``): the LPJob's status follows
  its pods: ``Running`` once every pod runs, ``Succeeded`` once every pod has
  succeeded, ``Failed`` (with the failing pod, its exit code and reason) when a
  pod fails and the job's ``restartPolicy`` is ``Never`` or its
  ``backoffLimit`` is used up; with ``OnFailure`` a failed pod is replaced and
  the job is ``Restarting`` (``restarts`` counts them). A failed job's other
  pods are deleted: nothing of it keeps running.
* **delete**: a finalizer deletes the children and waits until they are gone.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import datetime, timezone
from typing import Any

from tlaunch.k8s.children import LABEL_JOB, LABEL_ROLE, children
from tlaunch.k8s.crd import GROUP, PLURAL, VERSION

__all__ = ["job_status", "main"]

try:
    import kopf
    import kubernetes
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"the LPJob operator needs kopf and kubernetes: pip install 'tlaunch[k8s]' ({exc})"
    ) from exc

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _clients() -> tuple[Any, Any]:
    return kubernetes.client.CoreV1Api(), kubernetes.client.CustomObjectsApi()


def _create(manifest: dict[str, Any]) -> None:
    """Create one child (an existing one is kept: the handler may run again after a crash)."""
    core, custom = _clients()
    ns = manifest["metadata"]["namespace"]
    try:
        if manifest["apiVersion"] == "v1":
            create = {
                "Pod": core.create_namespaced_pod,
                "Service": core.create_namespaced_service,
                "ConfigMap": core.create_namespaced_config_map,
            }[manifest["kind"]]
            create(ns, manifest)
        else:
            group, version = manifest["apiVersion"].split("/")
            custom.create_namespaced_custom_object(group, version, ns, "podgroups", manifest)
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise


def _conditions(
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
        "conditions": _conditions(phase, reason, message, old.get("conditions")),
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


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        # KUBECONFIG as it is now: the client reads its default when first imported
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]


@kopf.on.login()
def _login(**kwargs: Any) -> Any:
    """In a pod, its service account; else the kubeconfig of ``$KUBECONFIG`` (read now, not at import)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.create(GROUP, VERSION, PLURAL)
def _on_create(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    lpjob = dict(body)
    for manifest in children(lpjob):
        _create(manifest)
    status = job_status(lpjob, [])
    patch.status.update(status)


@kopf.index("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT})
def pods_by_job(
    *, namespace: str | None, name: str, labels: kopf.Labels, status: kopf.Status, **_: Any
) -> Any:
    """Each LPJob's pods as the watch last saw them (a pod event reads them here, not from the API)."""
    meta = {"name": name, "namespace": namespace, "labels": dict(labels)}
    return {(namespace, labels[LABEL_JOB]): {"metadata": meta, "status": dict(status)}}


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT})
def _on_pod(body: kopf.Body, **kwargs: Any) -> None:
    index: kopf.Index[tuple[str, str], Any] = kwargs["pods_by_job"]
    ns = body["metadata"]["namespace"]
    job = body["metadata"]["labels"][LABEL_JOB]
    core, custom = _clients()
    try:
        lpjob = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return
        raise
    if lpjob["metadata"].get("deletionTimestamp") or (lpjob.get("status") or {}).get("phase") in (
        "Succeeded",
        "Failed",
    ):
        return
    # The index, with this event's pod as this event shows it (the index may not have it yet).
    this = {"metadata": dict(body["metadata"]), "status": dict(body.get("status") or {})}
    name = body["metadata"]["name"]
    pods = [p for p in index.get((ns, job), []) if p["metadata"]["name"] != name]
    if kwargs.get("type") != "DELETED" and body["metadata"].get("deletionTimestamp") is None:
        pods.append(this)  # (a deleted pod, a restarted one's old self among them, counts no more)
    status = job_status(lpjob, pods)
    spec = lpjob["spec"]
    restarts = status["restarts"]
    retry = spec.get("restartPolicy") == "OnFailure" and restarts < int(spec.get("backoffLimit", 0))
    if status["phase"] == "Failed" and retry:
        why = f"restart {restarts + 1}: {status['reason']}"
        _restart_failed(lpjob, pods)
        old = (lpjob.get("status") or {}).get("conditions")
        status.update(phase="Restarting", restarts=restarts + 1, reason=why)
        status["conditions"] = _conditions("Restarting", "PodRestarted", why, old)
    if status["phase"] == "Failed" and not spec.get("runSecret"):
        # (a tlaunch program's own coordinator ends its nodes, and reports the failure first)
        _end_others(core, ns, pods)
    if _same(status, lpjob.get("status") or {}):
        return  # a pod appeared or changed without changing the job's state: no write
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, job, {"status": status})


def _restart_failed(lpjob: dict[str, Any], pods: list[dict[str, Any]]) -> None:
    """Replace each failed pod by a new one of the same name."""
    core, _ = _clients()
    fresh = {m["metadata"]["name"]: m for m in children(lpjob) if m["kind"] == "Pod"}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Failed":
            continue
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                core.read_namespaced_pod(name, ns)
            except kubernetes.client.ApiException as exc:
                if exc.status == 404:
                    break
                raise
            time.sleep(0.1)
        _create(fresh[name])


def _same(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether two statuses say the same (transition times aside)."""

    def plain(status: dict[str, Any]) -> dict[str, Any]:
        conditions = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions", [])
        ]
        return {**status, "conditions": conditions}

    return plain(new) == plain(old)


def _end_others(core: Any, ns: str, pods: list[dict[str, Any]]) -> None:
    """A failed job keeps nothing running: its pods that still run are deleted."""
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Pending", "Running"):
            try:
                core.delete_namespaced_pod(pod["metadata"]["name"], ns, grace_period_seconds=5)
            except kubernetes.client.ApiException as exc:
                if exc.status != 404:
                    raise


@kopf.on.delete(GROUP, VERSION, PLURAL)
def _on_delete(body: kopf.Body, **_: Any) -> None:
    """The finalizer: every child goes before the LPJob does."""
    core, custom = _clients()
    ns, job = body["metadata"]["namespace"], body["metadata"]["name"]
    selector = f"{LABEL_JOB}={job}"
    for pod in core.list_namespaced_pod(ns, label_selector=selector).items:
        _gone(core.delete_namespaced_pod, pod.metadata.name, ns)
    for svc in core.list_namespaced_service(ns, label_selector=selector).items:
        _gone(core.delete_namespaced_service, svc.metadata.name, ns)
    for cm in core.list_namespaced_config_map(ns, label_selector=selector).items:
        _gone(core.delete_namespaced_config_map, cm.metadata.name, ns)
    if body["spec"].get("gangScheduling"):
        try:
            custom.delete_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", ns, "podgroups", job)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
    if core.list_namespaced_pod(ns, label_selector=selector).items:
        raise kopf.TemporaryError("the job's pods are still terminating", delay=1)


def _gone(delete: Any, name: str, ns: str) -> None:
    try:
        delete(name, ns)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise


def main(argv: list[str] | None = None) -> int:
    """``python -m tlaunch.k8s.operator [--namespace NS] [--standalone]``: run the operator."""
    import argparse
    import asyncio

    parser = argparse.ArgumentParser(prog="python -m tlaunch.k8s.operator", description="the LPJob operator")
    parser.add_argument("--namespace", "-n", action="append", help="watch these namespaces (default: all)")
    parser.add_argument("--standalone", action="store_true", help="no peering with other operators")
    args = parser.parse_args(argv)
    asyncio.run(
        kopf.operator(
            standalone=args.standalone,
            namespaces=args.namespace or [],
            clusterwide=not args.namespace,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
