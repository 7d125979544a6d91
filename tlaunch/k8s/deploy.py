"""What installs tlaunch on a cluster, and a user's TPod (pure: manifests, nothing applied).

``tlaunch k8s manifests | kubectl apply -f -`` installs the operator: the LPJob
CRD, a namespace, a service account with the least it needs (a ClusterRole
limited to LPJobs and their status, the pods, services and ConfigMaps it
creates, Volcano PodGroups, and events), and its Deployment.
``deploy/kustomization.yaml`` in the repository does the same for kustomize.

``tlaunch k8s tpod create USER ...`` makes a TPod (the seed's per-user
space): a namespace ``tpod-USER`` with a ResourceQuota (CPU, GPU, memory,
storage), a persistent volume claim ``tdata-USER`` labelled ``tlaunch.io/tpod``
mounted at ``/TData/USER`` (``code/``, ``data/``, ``cache/``, ``models/``; job
pods mount the same claim at ``/TData`` and run ``code/setup.sh`` first), and a
development pod with tlaunch that the user reaches over SSH (sshd in the pod,
the user's public key, a Service). The pod's service account may create and
follow LPJobs in its namespace, and read its own pod (``tlaunchrun`` finds its
namespace and claim there: :mod:`tlaunch.k8s.incluster`); creating an LPJob is
as powerful as creating pods, so that is what the user may do in their
namespace, within its quota.
"""

from __future__ import annotations

import re
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.k8s.crd import GROUP, PLURAL, QUANTITY, TPOD_LABEL, crd

__all__ = [
    "TPOD_SERVICE_ACCOUNT",
    "operator_manifests",
    "tdata_claim_name",
    "tpod_manifests",
    "tpod_namespace",
]

OPERATOR_NAMESPACE = "tlaunch-system"
_QUANTITY = re.compile(QUANTITY)
_USER = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
TPOD_SERVICE_ACCOUNT = "tpod"
"""The service account of a TPod's development pod (it may create LPJobs in the TPod's namespace)."""


def tpod_namespace(user: str) -> str:
    """The namespace of ``user``'s TPod: ``tpod-<user>``."""
    return f"tpod-{user}"


def tdata_claim_name(user: str) -> str:
    """The claim of ``user``'s TPod, mounted at ``/TData/<user>`` in it and at ``/TData`` in job pods."""
    return f"tdata-{user}"


_KEY = re.compile(
    r"^(ssh-(ed25519|rsa)|ecdsa-sha2-nistp\d+|sk-ssh-ed25519@openssh.com) [A-Za-z0-9+/=]+( .*)?$"
)


def operator_manifests(image: str, namespace: str = OPERATOR_NAMESPACE) -> list[dict[str, Any]]:
    """The CRD, namespace, RBAC and Deployment of the LPJob operator (image: one with ``tlaunch[k8s]``)."""
    labels = {"app.kubernetes.io/name": "tlaunch-operator"}
    rules = [
        {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list", "watch", "patch", "update"]},
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get", "patch", "update"]},
        {
            "apiGroups": [""],
            "resources": ["pods", "services", "configmaps"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        },
        # an LPJob's tdataClaim must be a TPod's claim (its label is read, nothing else)
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]},
        {
            "apiGroups": ["scheduling.volcano.sh"],
            "resources": ["podgroups"],
            "verbs": ["get", "create", "delete"],
        },
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
        # kopf discovers the resources it watches
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        },
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    ]
    return [
        crd(),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "tlaunch-operator", "namespace": namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "tlaunch-operator"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "tlaunch-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "tlaunch-operator",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "tlaunch-operator", "namespace": namespace}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "tlaunch-operator", "namespace": namespace, "labels": labels},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},  # one operator at a time
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "tlaunch-operator",
                        "containers": [
                            {
                                "name": "operator",
                                "image": image,
                                "command": ["python", "-m", "tlaunch.k8s.operator", "--standalone"],
                                "resources": {
                                    "requests": {"cpu": "100m", "memory": "128Mi"},
                                    "limits": {"cpu": "1", "memory": "512Mi"},
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "runAsNonRoot": True,
                                    "runAsUser": 1000,
                                },
                            }
                        ],
                    },
                },
            },
        },
    ]


def _quantity(name: str, value: str) -> str:
    if not _QUANTITY.match(str(value)):
        raise LaunchError(f"{name}={value!r} is not a Kubernetes quantity; write e.g. '8', '500m', '64Gi'")
    return str(value)


def tpod_manifests(
    user: str,
    ssh_key: str,
    image: str,
    cpu: str = "8",
    gpu: int = 0,
    memory: str = "32Gi",
    storage: str = "100Gi",
    storage_class: str | None = None,
    gpu_resource: str = "nvidia.com/gpu",
) -> list[dict[str, Any]]:
    """A user's TPod: namespace, quota, ``/TData/USER`` claim, SSH key, development pod and its Service.

    Raises:
        LaunchError: a user name that is not a DNS label, a public key that is not
            one line of OpenSSH's format, or a quantity Kubernetes would refuse.
    """
    if not _USER.match(user) or len(user) > 50:
        raise LaunchError(f"user={user!r} must be a DNS label: lower case, digits and '-' (e.g. 'alice')")
    if not _KEY.match(ssh_key.strip()) or "\n" in ssh_key.strip():
        raise LaunchError(
            "ssh_key is not an OpenSSH public key (one line: 'ssh-ed25519 AAAA... comment'); "
            "pass the contents of ~/.ssh/id_ed25519.pub, not the private key"
        )
    cpu, memory, storage = _quantity("cpu", cpu), _quantity("memory", memory), _quantity("storage", storage)
    if not isinstance(gpu, int) or gpu < 0:
        raise LaunchError(f"gpu={gpu!r} must be a whole number >= 0")
    ns = tpod_namespace(user)
    claim = tdata_claim_name(user)
    labels = {TPOD_LABEL: user}
    home = f"/TData/{user}"
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": storage}},
    }
    if storage_class:
        pvc_spec["storageClassName"] = storage_class
    hard = {
        "requests.cpu": cpu,
        "limits.cpu": cpu,
        "requests.memory": memory,
        "limits.memory": memory,
        "requests.storage": storage,
    }
    if gpu:
        hard[f"requests.{gpu_resource}"] = str(gpu)
    setup = (
        f"mkdir -p {home}/code {home}/data {home}/cache {home}/models /root/.ssh && "
        f"touch {home}/code/setup.sh && cp /etc/tlaunch-ssh/authorized_keys /root/.ssh/authorized_keys && "
        "chmod 700 /root/.ssh && chmod 600 /root/.ssh/authorized_keys && "
        "mkdir -p /run/sshd && ssh-keygen -A && "
        "exec /usr/sbin/sshd -D -e -o PasswordAuthentication=no -o PermitRootLogin=prohibit-password"
    )
    dev_limits: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpu:
        dev_limits[gpu_resource] = str(gpu)
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}},
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "tpod", "namespace": ns},
            "spec": {"hard": hard},
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": ns, "labels": labels},
            "spec": pvc_spec,
        },
        *_tpod_access(ns),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ssh-key", "namespace": ns},
            "data": {"authorized_keys": ssh_key.strip() + "\n"},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "dev", "namespace": ns, "labels": {**labels, "tlaunch.io/role": "dev"}},
            "spec": {
                "serviceAccountName": TPOD_SERVICE_ACCOUNT,
                "containers": [
                    {
                        "name": "dev",
                        "image": image,
                        "command": ["sh", "-c", setup],
                        "env": [  # tlaunchrun reads its own pod (its /TData claim) by this name
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                        ],
                        "ports": [{"containerPort": 22, "name": "ssh"}],
                        "resources": {"limits": dev_limits, "requests": {"cpu": cpu, "memory": memory}},
                        "volumeMounts": [
                            {"name": "tdata", "mountPath": home},
                            {"name": "ssh-key", "mountPath": "/etc/tlaunch-ssh", "readOnly": True},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "tdata", "persistentVolumeClaim": {"claimName": claim}},
                    {"name": "ssh-key", "configMap": {"name": "ssh-key"}},
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "dev-ssh", "namespace": ns},
            "spec": {
                "type": "NodePort",
                "selector": {**labels, "tlaunch.io/role": "dev"},
                "ports": [{"name": "ssh", "port": 22, "targetPort": 22}],
            },
        },
    ]


def _tpod_access(ns: str) -> list[dict[str, Any]]:
    """The development pod's service account and what it may do in its namespace: LPJobs, read pods."""
    rules = [
        {
            "apiGroups": [GROUP],
            "resources": [PLURAL],
            "verbs": ["create", "get", "list", "watch", "delete"],
        },
        {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
    ]
    name = TPOD_SERVICE_ACCOUNT
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": ns},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        },
    ]
