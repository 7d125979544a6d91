"""The ``LPJob`` custom resource (``lpjobs.tlaunch.io``): its definition, as the API server takes it (pure).

An LPJob is a distributed job: roles of replicas (``trainer`` x 4), the image,
the launch method (``basic``, ``torchrun``, ``deepspeed``, ``command``: those of
:data:`tlaunch.runtime.methods.METHODS` that run in pods, each with its own
section's schema from its entry), GPU resources for
the cluster's vGPU stack, gang scheduling, a restart policy. The operator
(:mod:`tlaunch.k8s.children` says what it creates) turns it into pods and a
headless service, and reports in its status subresource.

Creating an LPJob is as powerful as creating pods in its namespace: the
operator makes pods with the LPJob's image, command and env. It mounts no
Secret but the job's own run Secret (``runFiles``, named after the job) and no
claim but one labelled ``tlaunch.io/tpod`` (``tdataClaim``), and it refuses
two roles of one name; grant ``create`` on ``lpjobs`` as you grant it on pods.
"""

from __future__ import annotations

from typing import Any

from tlaunch.runtime.methods import METHODS, method_names

__all__ = [
    "GROUP",
    "KIND",
    "PHASES",
    "PLURAL",
    "POD_FIELDS",
    "PULL_POLICIES",
    "QUANTITY",
    "RESTART_POLICIES",
    "TPOD_LABEL",
    "VERSION",
    "crd",
    "lpjob_schema",
]

GROUP = "tlaunch.io"
VERSION = "v1alpha1"
KIND = "LPJob"
PLURAL = "lpjobs"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
RESTART_POLICIES = ("Never", "OnFailure")
LAUNCHERS = method_names("kubernetes")
GPU_STACKS = ("hami", "volcano")
PHASES = ("Created", "Running", "Restarting", "Succeeded", "Failed")
TPOD_LABEL = f"{GROUP}/tpod"
"""The label of a TPod's namespace and of the claims an LPJob may mount at ``/TData`` (value: the user)."""

_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS-1123 label
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
"""A Kubernetes quantity as tlaunch takes it (``500m``, ``2``, ``4Gi``)."""


def _str_list() -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}}


def _any_object() -> dict[str, Any]:
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


POD_FIELDS = (
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "runtimeClassName",
    "imagePullSecrets",
    "terminationGracePeriodSeconds",
    "activeDeadlineSeconds",
)
"""The pod fields a role may set (``role.pod``): where and how its pods are scheduled. Fields that
change what a pod may do (service account, host namespaces, volumes, security context) are not
among them: an LPJob's author gets no more than the operator's pods give."""


def _pod_schema() -> dict[str, Any]:
    seconds = {"type": "integer", "minimum": 0}
    return {
        "type": "object",
        "properties": {
            "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
            "tolerations": {"type": "array", "items": _any_object()},
            "affinity": _any_object(),
            "topologySpreadConstraints": {"type": "array", "items": _any_object()},
            "priorityClassName": {"type": "string"},
            "runtimeClassName": {"type": "string"},
            "imagePullSecrets": {
                "type": "array",
                "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            },
            "terminationGracePeriodSeconds": seconds,
            "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
        },
    }


def _role_schema() -> dict[str, Any]:
    quantity = {"type": "string", "pattern": QUANTITY}
    return {
        "type": "object",
        "required": ["name", "replicas"],
        "properties": {
            "name": {"type": "string", "pattern": _NAME, "maxLength": 20},
            "replicas": {"type": "integer", "minimum": 1, "maximum": 4096},
            "image": {
                "type": "string",
                "minLength": 1,
                "description": "this role's image (default: spec.image)",
            },
            "pod": _pod_schema(),
            "command": _str_list(),
            "args": _str_list(),
            "env": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}, "value": {"type": "string"}},
                },
            },
            "resources": {
                "type": "object",
                "properties": {
                    "gpu": {"type": "integer", "minimum": 0},
                    "gpuMemory": {"type": "integer", "minimum": 1, "description": "MiB per GPU"},
                    "gpuCores": {"type": "integer", "minimum": 1, "maximum": 100, "description": "% per GPU"},
                    "cpu": {**quantity, "description": "requested"},
                    "memory": {**quantity, "description": "requested"},
                    "cpuLimit": {**quantity, "description": "the limit (default: none)"},
                    "memoryLimit": {**quantity, "description": "the limit (default: none)"},
                },
            },
        },
    }


def lpjob_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of an LPJob (also a JSON schema: ``jsonschema`` checks LPJobs with it)."""
    spec = {
        "type": "object",
        "required": ["image", "roles"],
        "properties": {
            "image": {"type": "string", "minLength": 1},
            "imagePullPolicy": {"type": "string", "enum": list(PULL_POLICIES)},
            "launcher": {"type": "string", "enum": list(LAUNCHERS)},
            "gpuStack": {"type": "string", "enum": list(GPU_STACKS)},
            "gangScheduling": {"type": "boolean"},
            "restartPolicy": {"type": "string", "enum": list(RESTART_POLICIES)},
            "backoffLimit": {"type": "integer", "minimum": 0},
            "tdataClaim": {
                "type": "string",
                "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                "description": f"a claim of the job's namespace labelled {TPOD_LABEL}, mounted at /TData",
            },
            "workingDir": {
                "type": "string",
                "pattern": "^/",
                "description": "the containers' working directory",
            },
            "savePath": {"type": "string"},
            "checkpointPath": {"type": "string"},
            "shareFile": {"type": "string"},
            "setupScript": {"type": "string"},
            "runFiles": {
                "type": "boolean",
                "description": "mount the job's run Secret (tlaunch-run-<job>) read-only at /etc/tlaunch-run",
            },
            "package": {
                "type": "object",
                "description": "the job's package (package.tgz of the run Secret: needs runFiles), unpacked "
                "into each pod's working directory; with requirements, its runtime environment is built "
                "first (on /TData with tdataClaim, else in the pod)",
                "required": ["sha256"],
                "properties": {
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "requirements": {"type": "boolean"},
                },
            },
            **{m.name: m.pods.schema() for m in METHODS.values() if m.pods is not None and m.pods.section},
            "roles": {
                "type": "array",
                "minItems": 1,
                "items": _role_schema(),
                # the API server refuses two roles of one name (their pods would have the same names)
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
            },
        },
    }
    role_status = {
        "type": "object",
        "properties": {
            k: {"type": "integer", "minimum": 0} for k in ("total", "ready", "succeeded", "failed")
        },
    }
    status = {
        "type": "object",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "rolesReady": {"type": "string"},
            "restarts": {"type": "integer", "minimum": 0},
            "reason": {"type": "string"},
            "roles": {"type": "object", "additionalProperties": role_status},
            "conditions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        "type": {"type": "string", "enum": list(PHASES)},
                        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                        "reason": {"type": "string"},
                        "message": {"type": "string"},
                        "lastTransitionTime": {"type": "string"},
                    },
                },
            },
        },
    }
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def crd() -> dict[str, Any]:
    """The LPJob ``CustomResourceDefinition``; ``kubectl get lpjobs`` shows state, roles, restarts, age."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "lpjob", "kind": KIND, "shortNames": ["lpj"]},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": lpjob_schema()},
                    "additionalPrinterColumns": [
                        {"name": "State", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Roles", "type": "string", "jsonPath": ".status.rolesReady"},
                        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }
