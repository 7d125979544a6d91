"""What an LPJob becomes: its pods, headless service, hostfile ConfigMap and Volcano PodGroup (pure).

The operator creates exactly these (and ``tlaunchrun --dry-run`` prints them):

* a **headless service** named after the job: every pod has the stable name
  ``<job>-<role>-<i>.<job>.<namespace>.svc`` (torch's c10d rendezvous and
  DeepSpeed's master address use the first trainer's);
* a **pod** per replica of each role, with what a basic trainer gets on every
  backend (:mod:`tlaunch.torch.trainer`: ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK`` 0, ``LOCAL_WORLD_SIZE`` 1, ``MASTER_ADDR`` (the first pod's
  name), ``MASTER_PORT`` (the method section's ``masterPort``, default 29500),
  ``TLAUNCH_NUM_TRAINER``, ``TLAUNCH_SHARE_FILE``) and ``TLAUNCH_JOB``,
  ``TLAUNCH_ROLE``, ``POD_NAME``, ``POD_IP``; the
  launch method's command (its entry in :mod:`tlaunch.runtime.methods`:
  ``torchrun`` with c10d on the first trainer, DeepSpeed's per-node launcher
  with the job's hostfile, or the user's own);
  the role's image (default: the job's), CPU and memory requests and limits,
  GPU resources of the cluster's vGPU stack, and its scheduling fields
  (``role.pod``: only those of :data:`~tlaunch.k8s.crd.POD_FIELDS`);
  ``/TData`` from the job's claim, with ``code/setup.sh`` (or ``setupScript``)
  run first when it exists; the job's run Secret, :func:`run_secret_name`,
  with ``runFiles``; the job's ``package`` unpacked (and its runtime environment
  built) before the command (:mod:`tlaunch.k8s.package`);
* with ``deepspeed`` (a method with files for its pods), a **ConfigMap** holding the hostfile;
* with gang scheduling, a Volcano **PodGroup** (``minMember`` = every replica):
  no pod starts until all can.

Every child carries a controller owner reference to its LPJob (its uid), so
deleting the LPJob deletes them (and the operator's finalizer checks they are
gone); that reference, not the ``tlaunch.io/job`` label anyone can set, is what
makes an object the job's (:func:`lpjob_owner`).
"""

from __future__ import annotations

import shlex
from typing import Any

from tlaunch.k8s.crd import GROUP, KIND, POD_FIELDS, VERSION
from tlaunch.k8s.package import with_package
from tlaunch.runtime.method_pods import path_arguments
from tlaunch.runtime.methods import DEFAULT_METHOD, TORCH_MASTER_PORT, Pods, PodSide, get_method

__all__ = [
    "LABEL_JOB",
    "LABEL_ROLE",
    "TDATA",
    "children",
    "gpu_resources",
    "lpjob_owner",
    "pod_name",
    "pods",
    "run_secret_name",
]

LABEL_JOB = f"{GROUP}/job"
LABEL_ROLE = f"{GROUP}/role"
LABEL_INDEX = f"{GROUP}/index"
TDATA = "/TData"
HOSTFILE_DIR = "/etc/tlaunch"
RUN_DIR = "/etc/tlaunch-run"


def pod_name(job: str, role: str, index: int) -> str:
    """The name (and hostname) of replica ``index`` of ``role``."""
    return f"{job}-{role}-{index}"


def run_secret_name(job: str) -> str:
    """The name of LPJob ``job``'s run Secret (``tlaunch-run-<job>``): the only Secret ``runFiles`` mounts.

    The name follows from the job's, never from a free field of its spec, so an
    LPJob cannot mount another Secret of its namespace; the prefix keeps it
    apart from Secrets tlaunch did not make.
    """
    return f"tlaunch-run-{job}"


def lpjob_owner(meta: dict[str, Any]) -> tuple[str, str] | None:
    """``(name, uid)`` of the LPJob that an object's ``metadata`` names as its controller, or None.

    An object is an LPJob's only by this reference (the LPJob's uid): a pod
    that merely carries the ``tlaunch.io/job`` label is someone else's.
    """
    for ref in meta.get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == KIND
            and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/")
            and ref.get("uid")
        ):
            return str(ref["name"]), str(ref["uid"])
    return None


def _owner(lpjob: dict[str, Any]) -> list[dict[str, Any]]:
    meta = lpjob["metadata"]
    ref = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta.get("uid", "00000000-0000-0000-0000-000000000000"),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return [ref]


def _meta(lpjob: dict[str, Any], name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    job = lpjob["metadata"]["name"]
    return {
        "name": name,
        "namespace": lpjob["metadata"].get("namespace", "default"),
        "labels": {LABEL_JOB: job, **(labels or {})},
        "ownerReferences": _owner(lpjob),
    }


def gpu_resources(stack: str, gpu: int, memory_mib: int | None, cores: int | None) -> dict[str, str]:
    """Resource limits for ``gpu`` GPUs on the cluster's vGPU stack (``hami`` or ``volcano``)."""
    if not gpu:
        return {}
    if stack == "volcano":
        names = ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")
    else:
        names = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")
    out = {names[0]: str(gpu)}
    if memory_mib:
        out[names[1]] = str(memory_mib)
    if cores:
        out[names[2]] = str(cores)
    return out


def _dns(lpjob: dict[str, Any], role: str, index: int) -> str:
    job = lpjob["metadata"]["name"]
    ns = lpjob["metadata"].get("namespace", "default")
    return f"{pod_name(job, role, index)}.{job}.{ns}.svc"


def _launcher(lpjob: dict[str, Any]) -> str:
    return str(lpjob["spec"].get("launcher", DEFAULT_METHOD))


def _method(lpjob: dict[str, Any]) -> PodSide:
    """How the job's launch method runs in pods (its entry in :data:`tlaunch.runtime.methods.METHODS`)."""
    return get_method(_launcher(lpjob)).in_pods()


def _pods(lpjob: dict[str, Any], role: dict[str, Any]) -> Pods:
    """``role``'s pods as its method sees them: its section, each key there (its default if not given)."""
    hosts = tuple(_dns(lpjob, role["name"], i) for i in range(role["replicas"]))
    given = lpjob["spec"].get(_launcher(lpjob)) or {}
    settings = _method(lpjob).settings_of(given, len(hosts))
    return Pods(lpjob["metadata"]["name"], hosts, settings, lpjob["spec"].get("shareFile"))


def _command(lpjob: dict[str, Any], role: dict[str, Any], index: int) -> list[str]:
    """The container's command: the launch method around the role's own command and args."""
    spec = lpjob["spec"]
    user = [
        *role.get("command", []),
        *role.get("args", []),
        *path_arguments(spec.get("savePath"), spec.get("checkpointPath")),
    ]
    user = _method(lpjob).command(_pods(lpjob, role), index, user)
    if spec.get("tdataClaim"):  # TPods: the job's folders are made, the user's setup script runs first
        setup = spec.get("setupScript") or f"{TDATA}/code/setup.sh"
        files = (spec.get("checkpointPath"), spec.get("shareFile"))
        folders = {p.rsplit("/", 1)[0] for p in files if p}
        if spec.get("savePath"):
            folders.add(spec["savePath"])
        make = f"mkdir -p {shlex.join(sorted(folders))} && " if folders else ""
        script = shlex.quote(setup)
        return ["sh", "-c", f"{make}if [ -f {script} ]; then sh {script}; fi && exec {shlex.join(user)}"]
    return user


def _env(lpjob: dict[str, Any], role: dict[str, Any], index: int, first_role: str) -> list[dict[str, Any]]:
    """The container's environment, each name once: tlaunch's, the downward API's, then the role's own.

    A role's own variable replaces tlaunch's of the same name (as the last of
    two would in Kubernetes, which keeps both and warns).
    """
    spec, job = lpjob["spec"], lpjob["metadata"]["name"]
    env: dict[str, dict[str, Any]] = {}
    for name, value in (
        ("TLAUNCH_JOB", job),
        ("TLAUNCH_ROLE", role["name"]),
        ("RANK", str(index)),
        ("WORLD_SIZE", str(role["replicas"])),
        ("LOCAL_RANK", "0"),  # one trainer a pod
        ("LOCAL_WORLD_SIZE", "1"),
        ("MASTER_ADDR", _dns(lpjob, first_role, 0)),
        ("MASTER_PORT", str(_pods(lpjob, role).settings.get("masterPort", TORCH_MASTER_PORT))),
        ("TLAUNCH_NUM_TRAINER", str(role["replicas"])),
    ):
        env[name] = {"name": name, "value": value}
    if spec.get("shareFile"):
        env["TLAUNCH_SHARE_FILE"] = {"name": "TLAUNCH_SHARE_FILE", "value": spec["shareFile"]}
    for name, path in (("POD_NAME", "metadata.name"), ("POD_IP", "status.podIP")):  # the downward API
        env[name] = {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
    for e in role.get("env", []):
        env.pop(e["name"], None)  # (a replaced variable moves to the end: the role's own come last)
        env[e["name"]] = {"name": e["name"], "value": e.get("value", "")}
    return list(env.values())


def pods(lpjob: dict[str, Any]) -> list[dict[str, Any]]:
    """A pod per replica of every role."""
    spec = lpjob["spec"]
    job = lpjob["metadata"]["name"]
    out = []
    first_role = spec["roles"][0]["name"]
    for role in spec["roles"]:
        for i in range(role["replicas"]):
            name = pod_name(job, role["name"], i)
            env = _env(lpjob, role, i, first_role)
            res = role.get("resources", {})
            limits = gpu_resources(
                spec.get("gpuStack", "hami"),
                int(res.get("gpu", 0)),
                res.get("gpuMemory"),
                res.get("gpuCores"),
            )
            requests = {k: res[k] for k in ("cpu", "memory") if res.get(k)}
            limits.update({k: res[f"{k}Limit"] for k in ("cpu", "memory") if res.get(f"{k}Limit")})
            container: dict[str, Any] = {
                "name": role["name"],
                "image": role.get("image") or spec["image"],
                "imagePullPolicy": spec.get("imagePullPolicy", "IfNotPresent"),
                "command": with_package(spec, _command(lpjob, role, i)),
                "env": env,
                **({"workingDir": spec["workingDir"]} if spec.get("workingDir") else {}),
                "resources": {"limits": limits, "requests": requests} if limits or requests else {},
            }
            pod_spec: dict[str, Any] = {
                "hostname": name,
                "subdomain": job,
                "restartPolicy": "Never",  # the operator restarts per the job's policy
                "containers": [container],
                **{k: v for k, v in (role.get("pod") or {}).items() if k in POD_FIELDS},
            }
            if spec.get("tdataClaim"):
                container["volumeMounts"] = [{"name": "tdata", "mountPath": TDATA}]
                pod_spec["volumes"] = [
                    {"name": "tdata", "persistentVolumeClaim": {"claimName": spec["tdataClaim"]}}
                ]
            if spec.get("runFiles"):  # lp_k8s: the run's node files and keys, read-only
                run_mount = {"name": "run", "mountPath": RUN_DIR, "readOnly": True}
                container.setdefault("volumeMounts", []).append(run_mount)
                secret = {"secretName": run_secret_name(job), "defaultMode": 0o400}
                pod_spec.setdefault("volumes", []).append({"name": "run", "secret": secret})
            if _method(lpjob).files is not None:
                container.setdefault("volumeMounts", []).append(
                    {"name": "hostfile", "mountPath": HOSTFILE_DIR}
                )
                pod_spec.setdefault("volumes", []).append(
                    {"name": "hostfile", "configMap": {"name": f"{job}-hostfile"}}
                )
            meta = _meta(lpjob, name, {LABEL_ROLE: role["name"], LABEL_INDEX: str(i)})
            if spec.get("gangScheduling"):
                pod_spec["schedulerName"] = "volcano"
                meta["annotations"] = {"scheduling.k8s.io/group-name": job}
            out.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec})
    return out


def service(lpjob: dict[str, Any]) -> dict[str, Any]:
    """The headless service that gives every pod a stable DNS name."""
    job = lpjob["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(lpjob, job),
        "spec": {
            "clusterIP": "None",
            "selector": {LABEL_JOB: job},
            "publishNotReadyAddresses": True,  # rendezvous happens before pods are ready
            "ports": [{"name": "rendezvous", "port": 29400}, {"name": "master", "port": TORCH_MASTER_PORT}],
        },
    }


def hostfile(lpjob: dict[str, Any]) -> dict[str, Any]:
    """The files of the job's method (DeepSpeed's hostfile), as a ConfigMap every pod mounts."""
    files = _method(lpjob).files
    job = lpjob["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(lpjob, f"{job}-hostfile"),
        "data": files(_pods(lpjob, lpjob["spec"]["roles"][0])) if files else {},
    }


def pod_group(lpjob: dict[str, Any]) -> dict[str, Any]:
    """Volcano's PodGroup: no pod of the job is scheduled until all of them can be."""
    total = sum(r["replicas"] for r in lpjob["spec"]["roles"])
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": _meta(lpjob, lpjob["metadata"]["name"]),
        "spec": {"minMember": total},
    }


def children(lpjob: dict[str, Any]) -> list[dict[str, Any]]:
    """Everything the operator creates for ``lpjob``, in creation order."""
    out = [service(lpjob)]
    if _method(lpjob).files is not None:
        out.append(hostfile(lpjob))
    if lpjob["spec"].get("gangScheduling"):
        out.append(pod_group(lpjob))
    return out + pods(lpjob)
