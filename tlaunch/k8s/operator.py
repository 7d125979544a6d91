"""The LPJob operator (kopf): an LPJob becomes its pods and service; their phases become its status.

Run it in a cluster with the Deployment of ``tlaunch k8s manifests``, or by
hand: ``python -m tlaunch.k8s.operator`` (``kopf run`` underneath; every
namespace, or ``--namespace NS``). Needs ``pip install 'tlaunch[k8s]'``.

* **create**: the children of :func:`tlaunch.k8s.children.children` (headless
  service, hostfile ConfigMap, Volcano PodGroup, a pod per replica), each
  owned by the LPJob; status ``Created`` with every role's replica count. A
  job is refused (``Failed``, nothing of it left) when two roles share a name,
  when its ``tdataClaim`` is not a claim of its namespace labelled
  ``tlaunch.io/tpod`` (a TPod's), or when an object of a child's name exists
  that is not the job's.
* **pod events**: the LPJob's pods are those whose controller owner reference
  carries its uid (:func:`tlaunch.k8s.children.lpjob_owner`); a pod that only
  carries the ``tlaunch.io/job`` label is not the job's, whatever it does. The
  LPJob's status follows its pods: ``Running`` once every pod runs,
  ``Succeeded`` once every pod has succeeded, ``Failed`` (with the failing pod,
  its exit code and reason) when a pod fails and the job's ``restartPolicy`` is
  ``Never`` or its ``backoffLimit`` is used up; with ``OnFailure`` a failed pod
  is replaced and the job is ``Restarting`` (``restarts`` counts them). A
  failed job's other pods are deleted: nothing of it keeps running.
* **delete**: a finalizer deletes the job's children (its own, by owner uid)
  and waits until they are gone.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from tlaunch.k8s.children import LABEL_JOB, children, lpjob_owner
from tlaunch.k8s.client import connect, use_as_default
from tlaunch.k8s.crd import GROUP, PLURAL, TPOD_LABEL, VERSION
from tlaunch.k8s.status import conditions, job_status, refused_status, same, spec_error

__all__ = ["job_status", "main", "refused_status"]  # (the pure part is tlaunch.k8s.status)

try:
    import kopf
    import kubernetes
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        f"the LPJob operator needs kopf and kubernetes: pip install 'tlaunch[k8s]' ({exc})"
    ) from exc

log = logging.getLogger(__name__)


def _clients() -> tuple[Any, Any]:
    return kubernetes.client.CoreV1Api(), kubernetes.client.CustomObjectsApi()


class _Refused(Exception):
    """The job cannot be made; its message is the status's reason."""


def _create(manifest: dict[str, Any], uid: str) -> None:
    """Create one child; one that exists is kept only if it is the job's (the handler may run again).

    Raises:
        _Refused: an object of the child's name exists and is not the job's.
    """
    core, custom = _clients()
    ns, name, kind = manifest["metadata"]["namespace"], manifest["metadata"]["name"], manifest["kind"]
    if manifest["apiVersion"] == "v1":
        create, read = {
            "Pod": (core.create_namespaced_pod, core.read_namespaced_pod),
            "Service": (core.create_namespaced_service, core.read_namespaced_service),
            "ConfigMap": (core.create_namespaced_config_map, core.read_namespaced_config_map),
        }[kind]
    else:
        group, version = manifest["apiVersion"].split("/")

        def create(ns: str, body: dict[str, Any]) -> Any:
            return custom.create_namespaced_custom_object(group, version, ns, "podgroups", body)

        def read(name: str, ns: str) -> Any:
            return custom.get_namespaced_custom_object(group, version, ns, "podgroups", name)

    try:
        create(ns, manifest)
        return
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
    owner = lpjob_owner(_owner_refs(read(name, ns)))
    if owner is None or owner[1] != uid:
        raise _Refused(
            f"a {kind} named {name} already exists in namespace {ns} and is not this job's "
            "(another job's, or made by hand): rename the job or delete that object"
        )


def _owner_refs(obj: Any) -> dict[str, Any]:
    """The owner references of a client's answer (a model, or a dict for custom objects), as metadata."""
    if isinstance(obj, dict):
        return dict(obj.get("metadata") or {})
    refs = (obj.metadata and obj.metadata.owner_references) or []
    return {
        "ownerReferences": [
            {
                "apiVersion": r.api_version,
                "kind": r.kind,
                "name": r.name,
                "uid": r.uid,
                "controller": r.controller,
            }
            for r in refs
        ]
    }


def _ours(obj: Any, uid: str) -> bool:
    """Whether ``obj`` (a client model or a dict) is controlled by the LPJob of ``uid``."""
    owner = lpjob_owner(_owner_refs(obj))
    return owner is not None and owner[1] == uid


def _claim_error(core: Any, lpjob: dict[str, Any]) -> str | None:
    """Why the job may not mount its ``tdataClaim``, or None (no claim, or a TPod's claim)."""
    claim = lpjob["spec"].get("tdataClaim")
    if not claim:
        return None
    ns = lpjob["metadata"]["namespace"]
    try:
        pvc = core.read_namespaced_persistent_volume_claim(claim, ns)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise
        return f"tdataClaim {claim!r}: no such persistent volume claim in namespace {ns}"
    if TPOD_LABEL not in ((pvc.metadata and pvc.metadata.labels) or {}):
        return (
            f"tdataClaim {claim!r} is not labelled {TPOD_LABEL}: an LPJob mounts only a TPod's claim at "
            f"/TData (tlaunch k8s tpod create labels it; an administrator may label another with "
            f"kubectl label pvc {claim} -n {ns} {TPOD_LABEL}=<user>)"
        )
    return None


@kopf.on.startup()
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 60
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    # The client's credentials as every tlaunch client finds them: $KUBECONFIG as it is now (the
    # client reads its default when first imported), else the pod's service account.
    use_as_default(connect())


@kopf.on.login()
def _login(**kwargs: Any) -> Any:
    """In a pod, its service account; else the kubeconfig of ``$KUBECONFIG`` (read now, not at import)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.create(GROUP, VERSION, PLURAL)
def _on_create(body: kopf.Body, **_: Any) -> None:
    lpjob = dict(body)
    core, custom = _clients()
    ns, name = lpjob["metadata"]["namespace"], lpjob["metadata"]["name"]

    def write(status: dict[str, Any]) -> None:
        # now, through the API: kopf would apply a handler's patch after it returns, over what the
        # pods' events may have written by then (a pod failing at once would be lost under "Created")
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name, {"status": status})

    try:
        problem = spec_error(lpjob) or _claim_error(core, lpjob)
        if problem:
            raise _Refused(problem)
        if not (lpjob.get("status") or {}).get("phase"):  # (not again if the handler runs again)
            write(job_status(lpjob, []))
        for manifest in children(lpjob):
            _create(manifest, lpjob["metadata"]["uid"])
    except _Refused as refused:
        _delete_children(core, custom, lpjob)  # (what this handler made before the refusal)
        write(refused_status(lpjob, str(refused)))


def _job_pod(meta: kopf.Meta, **_: Any) -> bool:
    """A pod some LPJob controls (its owner reference; the label only narrows the watch)."""
    return lpjob_owner(dict(meta)) is not None


@kopf.index("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT}, when=_job_pod)
def pods_by_job(*, namespace: str | None, meta: kopf.Meta, status: kopf.Status, **_: Any) -> Any:
    """Each LPJob's pods (by its uid) as the watch last saw them (a pod event reads them here)."""
    owner = lpjob_owner(dict(meta))
    assert owner is not None  # (the filter)
    plain = {"name": meta["name"], "namespace": namespace, "labels": dict(meta.get("labels") or {})}
    return {(namespace, owner[1]): {"metadata": plain, "status": dict(status)}}


@kopf.on.event("", "v1", "pods", labels={LABEL_JOB: kopf.PRESENT}, when=_job_pod)
def _on_pod(body: kopf.Body, **kwargs: Any) -> None:
    index: kopf.Index[tuple[str, str], Any] = kwargs["pods_by_job"]
    ns = body["metadata"]["namespace"]
    owner = lpjob_owner(dict(body["metadata"]))
    if owner is None:
        return
    job, uid = owner
    core, custom = _clients()
    try:
        lpjob = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return
        raise
    if lpjob["metadata"].get("uid") != uid:
        return  # a pod of an earlier job of that name
    if lpjob["metadata"].get("deletionTimestamp") or (lpjob.get("status") or {}).get("phase") in (
        "Succeeded",
        "Failed",
    ):
        return
    # The index, with this event's pod as this event shows it (the index may not have it yet).
    this = {"metadata": dict(body["metadata"]), "status": dict(body.get("status") or {})}
    name = body["metadata"]["name"]
    pods = [p for p in index.get((ns, uid), []) if p["metadata"]["name"] != name]
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
        status["conditions"] = conditions("Restarting", "PodRestarted", why, old)
    if status["phase"] == "Failed" and not spec.get("runFiles"):
        # (a tlaunch program's own coordinator ends its nodes, and reports the failure first)
        _end_others(core, ns, pods)
    if same(status, lpjob.get("status") or {}):
        return  # a pod appeared or changed without changing the job's state: no write
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, job, {"status": status})


def _restart_failed(lpjob: dict[str, Any], pods: list[dict[str, Any]]) -> None:
    """Replace each failed pod of the job (``pods``: the job's own) by a new one of the same name."""
    core, _ = _clients()
    fresh = {m["metadata"]["name"]: m for m in children(lpjob) if m["kind"] == "Pod"}
    for pod in pods:
        name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        if (pod.get("status") or {}).get("phase") != "Failed" or name not in fresh:
            continue
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
        _create(fresh[name], lpjob["metadata"]["uid"])


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
    if _delete_children(core, custom, dict(body)):
        raise kopf.TemporaryError("the job's pods are still terminating", delay=1)


def _delete_children(core: Any, custom: Any, lpjob: dict[str, Any]) -> bool:
    """Delete the job's own children (by owner uid; the label only narrows the lists); any pods left?"""
    ns, job, uid = lpjob["metadata"]["namespace"], lpjob["metadata"]["name"], lpjob["metadata"]["uid"]
    selector = f"{LABEL_JOB}={job}"
    for pod in core.list_namespaced_pod(ns, label_selector=selector).items:
        if _ours(pod, uid):
            _gone(core.delete_namespaced_pod, pod.metadata.name, ns)
    for svc in core.list_namespaced_service(ns, label_selector=selector).items:
        if _ours(svc, uid):
            _gone(core.delete_namespaced_service, svc.metadata.name, ns)
    for cm in core.list_namespaced_config_map(ns, label_selector=selector).items:
        if _ours(cm, uid):
            _gone(core.delete_namespaced_config_map, cm.metadata.name, ns)
    if lpjob["spec"].get("gangScheduling"):
        group = ("scheduling.volcano.sh", "v1beta1", ns, "podgroups", job)
        try:
            if _ours(custom.get_namespaced_custom_object(*group), uid):
                custom.delete_namespaced_custom_object(*group)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
    return any(_ours(p, uid) for p in core.list_namespaced_pod(ns, label_selector=selector).items)


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
