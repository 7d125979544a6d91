"""LPJobs by name: submit one with a record in the run store, find one, list a cluster's.

``tlaunch.control.submit(job, Kubernetes(...))`` and ``tlaunchrun`` submit
through :func:`submit_lpjob`; ``tlaunchrun status/logs/delete NAME`` find the
job with :func:`find_lpjob` (its record in the run store when this machine
submitted it, else the cluster's LPJob), ``tlaunchrun ls`` lists them with
:func:`list_lpjobs`. Each is an :class:`~tlaunch.backends.k8s.run.LPJobRun`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from typing import Any

from tlaunch.backends.k8s.api import NOT_INSTALLED, JobAPI, asking
from tlaunch.backends.k8s.manifests import LABEL_RUN_ID, run_id_label, run_secret
from tlaunch.backends.k8s.run import BACKEND, LPJobRun
from tlaunch.errors import LaunchError, RunNotFoundError
from tlaunch.k8s.children import run_secret_name
from tlaunch.k8s.client import connect
from tlaunch.k8s.crd import GROUP, PLURAL, VERSION
from tlaunch.runtime.records import RunRecord, list_records, runs_dir, write_record

__all__ = ["find_lpjob", "list_lpjobs", "submit_lpjob"]


def submit_lpjob(
    lpjob: dict[str, Any],
    run_id: str,
    run_dir: str,
    kube_config: str | None = None,
    files: Mapping[str, bytes] | None = None,
    impersonate: str | None = None,
) -> LPJobRun:
    """Create ``lpjob`` (labelled with ``run_id``) and record it in ``run_dir``; its handle.

    ``impersonate``: the user the API server creates it as (``Impersonate-User``: that user's RBAC
    decides; a job server's ``--unix-users``). The handle reads it with the credentials' own rights.

    ``files`` go in the job's run Secret (made first, then owned by the LPJob, so it goes
    with it), which its pods mount read-only (``runFiles``, set here): a job's package.

    Raises:
        LaunchError: the cluster refused the job, or cannot be reached (nothing is left).
    """
    kube = connect(kube_config, impersonate)
    manifest = copy.deepcopy(lpjob)
    meta = manifest["metadata"]
    name, namespace = meta["name"], kube.namespace_for(meta.get("namespace"))
    meta["namespace"] = namespace
    meta.setdefault("labels", {})[LABEL_RUN_ID] = run_id_label(run_id)
    api = JobAPI(kube, name, namespace)
    if files:
        manifest["spec"]["runFiles"] = True
        with asking(kube, f"the cluster refused the Secret of LPJob {name!r}", if_missing=NOT_INSTALLED):
            kube.core.create_namespaced_secret(namespace, run_secret(name, namespace, files))
    try:
        with asking(kube, f"the cluster refused LPJob {name!r}", if_missing=NOT_INSTALLED):
            made = kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, manifest)
        if files:
            owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "LPJob", "name": name,
                     "uid": made["metadata"]["uid"], "controller": False}  # fmt: skip
            with asking(kube, f"could not make LPJob {name!r} the owner of its Secret"):
                kube.core.patch_namespaced_secret(
                    run_secret_name(name), namespace, {"metadata": {"ownerReferences": [owner]}}
                )
    except BaseException:
        if files:
            with contextlib.suppress(LaunchError):
                api.delete()
            api.delete_secret(run_secret_name(name))
        raise
    refs = {"lpjob": name, "namespace": namespace, "kind": "job"}
    if kube.kube_config:
        refs["kube_config"] = kube.kube_config
    record = RunRecord(run_id, name, BACKEND, "", None, refs=refs)
    write_record(run_dir, record)
    handle_api = api if impersonate is None else JobAPI(connect(kube_config), name, namespace)
    return LPJobRun(name, namespace, run_id, kube_config=kube.kube_config, run_dir=run_dir, api=handle_api)


def find_lpjob(
    name: str, namespace: str | None = None, kube_config: str | None = None, home: str | None = None
) -> LPJobRun:
    """LPJob ``name`` (in ``namespace``, default: the credentials' own) as a run.

    Its record in the run store of ``home`` is used when it is the same job
    (the LPJob's run id), or when the LPJob is gone.

    Raises:
        RunNotFoundError: no LPJob of that name, and no record of one.
        LaunchError: the cluster cannot be reached.
    """
    kube = connect(kube_config)
    namespace = kube.namespace_for(namespace)
    api = JobAPI(kube, name, namespace)
    job = api.job()
    records = [
        (d, r)
        for d, r in list_records(runs_dir(home))
        if r.backend == BACKEND and r.refs.get("lpjob") == name and r.refs.get("namespace") == namespace
    ]
    if job is not None:
        run_id = ((job.get("metadata") or {}).get("labels") or {}).get(LABEL_RUN_ID)
        same = [(d, r) for d, r in records if run_id and run_id_label(r.run_id) == run_id]
        if same:
            return LPJobRun.from_record(*same[0], api=api)
        return LPJobRun(name, namespace, run_id or name, kube_config=kube.kube_config, api=api).seen(job)
    if records:
        return LPJobRun.from_record(*records[0], api=api)
    raise RunNotFoundError(f"no LPJob {name!r} in namespace {namespace} (kubectl get lpjobs -n {namespace})")


def list_lpjobs(namespace: str | None = None, kube_config: str | None = None) -> list[LPJobRun]:
    """Every LPJob of ``namespace`` (None: of every namespace), as runs.

    Raises:
        LaunchError: the cluster refused, or cannot be reached.
    """
    kube = connect(kube_config)
    with asking(kube, "cannot list LPJobs", if_missing=NOT_INSTALLED):
        if namespace:
            items = kube.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        else:
            items = kube.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    runs = []
    for job in items:
        meta = job["metadata"]
        api = JobAPI(kube, meta["name"], meta["namespace"])
        run_id = (meta.get("labels") or {}).get(LABEL_RUN_ID) or meta["name"]
        runs.append(
            LPJobRun(meta["name"], meta["namespace"], run_id, kube_config=kube.kube_config, api=api).seen(job)
        )
    return runs
