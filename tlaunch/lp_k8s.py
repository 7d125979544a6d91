"""Launchpad programs on Kubernetes: ``lp_k8s.launch(program, image=...)``.

The program becomes an LPJob (run by the operator, ``docs/k8s.md``): its first
role is the run's coordinator (one pod), then one role per group of the
program, one pod per node (``consumer``, ``producer`` x 3...). A Secret owned by
the LPJob holds the run's files: the coordinator's, and each node's (the node,
cloudpickled with the user's own modules by value, and the run's TLS keys);
pods mount it read-only (:mod:`tlaunch.k8s.pod` is what they run). Nodes reach
the coordinator by its stable name in the job's headless service, and each
other at their pod IPs, over the same mutually authenticated RPC as everywhere.

::

    from tlaunch import lp_k8s
    run = lp_k8s.launch(program, image="repo/trainer:1", namespace="team-rl")
    run.wait()        # raises the failing node's RunFailedError, traceback included

The image must have tlaunch (and the program's dependencies) installed, at
the launcher's Python minor version. Needs ``pip install 'tlaunch[k8s]'``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import pickle
import re
import time
from typing import Any

from tlaunch.errors import LaunchError, RunFailedError, failure_from_report
from tlaunch.hosts import HostSpec
from tlaunch.jobs.spec import JobSpec
from tlaunch.k8s.children import run_secret_name
from tlaunch.k8s.crd import GROUP, PLURAL, PULL_POLICIES, VERSION
from tlaunch.k8s.pod import node_file_name
from tlaunch.plan import make_plan, placed_nodes
from tlaunch.program import Program
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.bundle import pickle_nodes
from tlaunch.runtime.head import HeadFile
from tlaunch.runtime.node_runtime import RuntimeConfig
from tlaunch.runtime.supervisor import NodeFile

__all__ = ["K8sRun", "launch"]

COORDINATOR_PORT = 7070
_SECRET_LIMIT = 1 << 20  # the API server's limit on a Secret


def _job_name(program_name: str, run_id: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", program_name.lower()).strip("-")[:30] or "program"
    return f"{base}-{run_id.rsplit('-', 1)[-1]}"


def _role(label: str, taken: set[str]) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", label.lower()).strip("-")[:16] or "group"
    while name in taken:
        name = f"{name[:14]}-{len(taken)}"
    taken.add(name)
    return name


def _kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise LaunchError("lp_k8s needs the kubernetes client: pip install 'tlaunch[k8s]'") from None
    kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    return kubernetes


def launch(
    program: Program,
    image: str,
    namespace: str = "default",
    *,
    image_pull_policy: str = "IfNotPresent",
    wait: bool = True,
    max_restarts: int = 0,
    stop_grace: float = 5.0,
    env: dict[str, str] | None = None,
    coordinator_port: int = COORDINATOR_PORT,
    timeout: float | None = None,
) -> K8sRun:
    """Run ``program`` on the cluster of ``$KUBECONFIG`` as an LPJob; wait for it unless ``wait=False``.

    Raises:
        LaunchError: a node placed with ``to_host()``, a program too large for a
            Secret, a bad option, or the cluster refused the job (nothing left).
        RunFailedError: (when waiting) a node failed: its key, pod and traceback.
    """
    if image_pull_policy not in PULL_POLICIES:
        raise LaunchError(f"image_pull_policy={image_pull_policy!r} is not one of {list(PULL_POLICIES)}")
    plan = make_plan(program)
    placed = [n.key for n in plan.nodes if n.host is not None]
    if placed:
        raise LaunchError(
            f"node {placed[0]!r} is placed with .to_host(); on Kubernetes every node gets a pod of its own: "
            "drop .to_host()"
        )
    keys = RunKeys.generate()
    nodes = {n.key or "": n for n in placed_nodes(program)}
    payloads = pickle_nodes(nodes, by_value=True)
    name = _job_name(plan.program_name, plan.run_id)
    files: dict[str, bytes] = {}
    pods = _pod_names(name, plan)
    placed_plan = dataclasses.replace(
        plan, nodes=tuple(dataclasses.replace(n, host=HostSpec(pods[n.key])) for n in plan.nodes)
    )  # the coordinator reports each node on its pod
    head = HeadFile(placed_plan, keys, "", 10.0, float("inf"), stop_grace, attached=False, keep=True)
    files["head"] = pickle.dumps(head)
    for spec in plan.nodes:
        config = RuntimeConfig(
            plan.run_id, plan.program_name, keys, "0.0.0.0", stop_grace=stop_grace, launch_type="k8s"
        )
        node = NodeFile(config, spec.key, payloads[spec.key], "", dict(env or {}), max_restarts, keep=True)
        files[node_file_name(spec.key)] = pickle.dumps(node)
    size = sum(len(v) for v in files.values())
    if size > _SECRET_LIMIT * 3 // 4:  # base64 grows it by a third
        raise LaunchError(
            f"the program's nodes take {size / 2**20:.1f} MiB pickled, more than a Secret holds (1 MiB): "
            "pass large data as files in the image or a volume, and paths to the nodes"
        )
    lpjob = _lpjob(name, namespace, image, image_pull_policy, plan, coordinator_port)
    k = _kubernetes()
    core, custom = k.client.CoreV1Api(), k.client.CustomObjectsApi()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": run_secret_name(name), "namespace": namespace, "labels": {f"{GROUP}/job": name}},
        "type": "Opaque",
        "data": {key: base64.b64encode(value).decode() for key, value in files.items()},
    }
    try:
        core.create_namespaced_secret(namespace, secret)
        made = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, lpjob)
    except k.client.ApiException as exc:
        _delete_quietly(core.delete_namespaced_secret, run_secret_name(name), namespace)
        raise LaunchError(
            f"the cluster refused run {name!r}: {exc.status} {exc.reason}: {exc.body}"
        ) from None
    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LPJob",
        "name": name,
        "uid": made["metadata"]["uid"],
        "controller": False,
    }
    core.patch_namespaced_secret(run_secret_name(name), namespace, {"metadata": {"ownerReferences": [owner]}})
    run = K8sRun(name, namespace, plan.run_id)
    if wait:
        try:
            run.wait(timeout)
        except KeyboardInterrupt:
            run.stop()
            raise
    return run


def _roles(plan: Any) -> dict[str, str]:
    """The role (a DNS label) of each group label of ``plan``, in order."""
    taken = {"coordinator"}
    roles: dict[str, str] = {}
    for node in plan.nodes:
        if node.label not in roles:
            roles[node.label] = _role(node.label, taken)
    return roles


def _pod_names(job: str, plan: Any) -> dict[str, str]:
    """Each node's pod: ``<job>-<role>-<index>``."""
    roles = _roles(plan)
    return {n.key: f"{job}-{roles[n.label]}-{n.index}" for n in plan.nodes}


def _lpjob(name: str, namespace: str, image: str, pull: str, plan: Any, port: int) -> dict[str, Any]:
    """The LPJob: the coordinator's role, then a role per group (pods ``<job>-<role>-<i>``)."""
    coordinator = f"{name}-coordinator-0.{name}.{namespace}.svc:{port}"
    role_of = _roles(plan)
    spec = JobSpec(lpjob_name=name, script=["python"], image=image, namespace=namespace).to_lpjob()
    roles = [
        {
            "name": "coordinator",
            "replicas": 1,
            "command": ["python", "-m", "tlaunch.k8s.pod", "head"],
            "env": [{"name": "TLAUNCH_COORDINATOR_PORT", "value": str(port)}],
        }
    ]
    groups: dict[str, int] = {}
    for node in plan.nodes:
        groups[node.label] = groups.get(node.label, 0) + 1
    for label, count in groups.items():
        env = [
            {"name": "TLAUNCH_GROUP", "value": label},
            {"name": "TLAUNCH_COORDINATOR", "value": coordinator},
        ]
        cmd = ["python", "-m", "tlaunch.k8s.pod", "node"]
        roles.append({"name": role_of[label], "replicas": count, "command": cmd, "env": env})
    spec["spec"].update(imagePullPolicy=pull, roles=roles, runFiles=True)
    spec["metadata"]["labels"] = {f"{GROUP}/run-id": plan.run_id[-63:]}
    return spec


def _delete_quietly(delete: Any, *args: Any) -> None:
    """Delete, if it is still there and the cluster answers (nothing more can be done otherwise)."""
    with contextlib.suppress(Exception):
        delete(*args)


class K8sRun:
    """A Launchpad program running as an LPJob.

    Attributes:
        name: the LPJob's name (``kubectl get lpjob NAME``).
        namespace: its namespace.
        run_id: tlaunch's id of the run.
    """

    def __init__(self, name: str, namespace: str, run_id: str) -> None:
        self.name = name
        self.namespace = namespace
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"K8sRun({self.namespace}/{self.name})"

    def status(self) -> dict[str, Any]:
        """The LPJob's status (phase, roles, reason...)."""
        k = _kubernetes()
        job = k.client.CustomObjectsApi().get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name
        )
        return dict(job.get("status") or {})

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> str:
        """Wait until the job has ended; ``Succeeded``.

        Raises:
            RunFailedError: a node failed (its key, its pod, its traceback).
            TimeoutError: not ended within ``timeout`` s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            phase = self.status().get("phase")
            if phase in ("Succeeded", "Failed"):
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"LPJob {self.name} is still {phase} after {timeout} s")
            time.sleep(poll)
        if phase == "Failed":
            raise self._failure()
        return str(phase)

    def _failure(self) -> RunFailedError:
        """The first failing node, from the coordinator's final report in its pod's log."""
        final = self._final()
        failure = final.get("failure") if final else None
        if not failure:
            reason = self.status().get("reason", "failed")
            return RunFailedError(self.name, self.namespace, None, None, reason)
        return failure_from_report(failure)

    def _final(self) -> dict[str, Any] | None:
        k = _kubernetes()
        deadline = time.monotonic() + 15.0  # the head writes it once every node has ended
        while time.monotonic() < deadline:
            try:
                text = k.client.CoreV1Api().read_namespaced_pod_log(
                    f"{self.name}-coordinator-0", self.namespace
                )
            except k.client.ApiException:
                return None
            for line in str(text).splitlines():
                if line.startswith('{"tlaunch_final"'):
                    return dict(json.loads(line)["tlaunch_final"])
            time.sleep(0.2)
        return None

    def logs(self) -> dict[str, str]:
        """Each pod's log, by pod name."""
        k = _kubernetes()
        core = k.client.CoreV1Api()
        pods = core.list_namespaced_pod(self.namespace, label_selector=f"{GROUP}/job={self.name}").items
        return {
            p.metadata.name: str(core.read_namespaced_pod_log(p.metadata.name, self.namespace)) for p in pods
        }

    def stop(self) -> None:
        """Delete the LPJob: the operator deletes its pods (the nodes get SIGTERM, then SIGKILL)."""
        k = _kubernetes()
        _delete_quietly(
            k.client.CustomObjectsApi().delete_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            self.name,
        )
