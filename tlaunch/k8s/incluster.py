"""Where am I: is this process in a pod (a user's TPod), and what does that say about a job it submits?

In the seed a user runs ``tlaunchrun`` inside their TPod (``tlaunch k8s tpod
create``, :mod:`tlaunch.k8s.deploy`): the job's namespace is the pod's own, and
``/TData`` in the job's pods is the claim mounted under ``/TData`` in the TPod.
:func:`here` finds them:

* **in a pod?** Its service account's ``namespace`` file says so, and names
  the namespace: ``/var/run/secrets/kubernetes.io/serviceaccount/namespace``,
  or in the folder ``$TLAUNCH_SERVICE_ACCOUNT_DIR`` names (tests point it at a
  folder of their own). No file: not in a pod, and nothing is guessed.
* **the claim**: the persistent volume claim mounted at ``/TData`` (or
  ``/TData/<user>``, as a TPod mounts it) in this pod, read from the API by
  the pod's own name (``$POD_NAME``, which a TPod sets from the downward API,
  else the host name, which is the pod's name); when the API cannot say (no
  permission, no such pod, no cluster), the TPod naming convention: namespace
  ``tpod-<user>``, claim ``tdata-<user>`` at ``/TData/<user>``.
* **the working directory** of the job's pods: the current directory when it
  lies in the claim (``/TData/alice/code/mnist`` here is ``/TData/code/mnist``
  in a job's pod, which mounts the claim at ``/TData``); ``$TLAUNCH_MOUNT_ROOT``
  prefixes mount paths, as for the tests' stand-in kubelet.

:func:`load_config` points the kubernetes client's default configuration at
the cluster, as :func:`tlaunch.k8s.client.connect` finds it (a kubeconfig when
there is one, ``$KUBECONFIG`` or ``~/.kube/config``, else the pod's service
account).
"""

from __future__ import annotations

import os
import posixpath
import socket
from dataclasses import dataclass
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.k8s.children import TDATA
from tlaunch.k8s.client import (
    SERVICE_ACCOUNT_DIR,
    SERVICE_ACCOUNT_DIR_ENV,
    connect,
    service_account_dir,
    use_as_default,
)
from tlaunch.k8s.deploy import tdata_claim_name, tpod_namespace

__all__ = [
    "InPod",
    "SERVICE_ACCOUNT_DIR",
    "SERVICE_ACCOUNT_DIR_ENV",
    "here",
    "load_config",
    "service_account_dir",
    "tdata_claim_of",
]


@dataclass(frozen=True)
class InPod:
    """The pod this process runs in, as a job submitted from it needs it.

    Attributes:
        namespace: the pod's namespace (its service account's).
        pod: the pod's name.
        tdata_claim: the claim mounted under ``/TData`` here, if any.
        tdata_mount: where it is mounted here (``/TData`` or ``/TData/alice``).
        found_by: how the claim was found: ``"the pod's volumes"`` or ``"the TPod naming
            convention"`` (and why the pod's volumes could not say), or ``""`` (none).
    """

    namespace: str
    pod: str
    tdata_claim: str | None = None
    tdata_mount: str | None = None
    found_by: str = ""

    def working_dir(self, cwd: str) -> str | None:
        """The folder of a job's pod that is ``cwd`` here, if ``cwd`` lies in the claim (else None)."""
        if not self.tdata_mount:
            return None
        mount = os.path.normpath(os.environ.get("TLAUNCH_MOUNT_ROOT", "") + self.tdata_mount)
        rel = os.path.relpath(os.path.normpath(cwd), mount)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
            return None
        return TDATA if rel == os.curdir else posixpath.join(TDATA, *rel.split(os.sep))


def _namespace() -> str | None:
    try:
        with open(os.path.join(service_account_dir(), "namespace")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def tdata_claim_of(pod: dict[str, Any]) -> tuple[str, str] | None:
    """``(claim, mount path)`` of the claim a pod (a manifest, as JSON) mounts at or under ``/TData``.

    ``/TData`` itself first, then the shortest path under it; None if none.
    """
    spec = pod.get("spec") or {}
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in spec.get("volumes") or []
        if (v.get("persistentVolumeClaim") or {}).get("claimName")
    }
    found = [
        (m["mountPath"].rstrip("/") or "/", claims[m["name"]])
        for c in spec.get("containers") or []
        for m in c.get("volumeMounts") or []
        if m.get("name") in claims and (m["mountPath"].rstrip("/") + "/").startswith(TDATA + "/")
    ]
    if not found:
        return None
    path, claim = min(found, key=lambda f: (f[0].count("/"), f[0]))
    return claim, path


def _read_own_pod(namespace: str, name: str) -> dict[str, Any] | str:
    """This pod from the API, as JSON; or why it could not be read."""
    try:
        kube = connect()
    except LaunchError as exc:  # no kubernetes client, no credentials
        return f"no cluster to ask ({exc})"
    try:
        import urllib3

        pod = kube.core.read_namespaced_pod(name, namespace)
        return dict(kube.api.sanitize_for_serialization(pod))
    except kube.ApiException as exc:
        said = f"{getattr(exc, 'status', '?')} {getattr(exc, 'reason', '')}"
        return f"the API answered {said} for pod {namespace}/{name}"
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return f"no cluster to ask ({exc})"


def here() -> InPod | None:
    """The pod this process runs in (namespace, claim under ``/TData``), or None outside a pod."""
    namespace = _namespace()
    if namespace is None:
        return None
    name = os.environ.get("POD_NAME") or socket.gethostname()
    pod = _read_own_pod(namespace, name)
    if isinstance(pod, dict):
        found = tdata_claim_of(pod)
        if found is not None:
            return InPod(namespace, name, found[0], found[1], "the pod's volumes")
        why = f"pod {namespace}/{name} mounts no claim under {TDATA}"
    else:
        why = pod
    if namespace.startswith(tpod_namespace("")):
        user = namespace[len(tpod_namespace("")) :]
        convention = f"the TPod naming convention ({why})"
        return InPod(namespace, name, tdata_claim_name(user), f"{TDATA}/{user}", convention)
    return InPod(namespace, name)


def load_config(kubernetes: Any) -> None:
    """Point the kubernetes client's default configuration at the cluster (``client.connect``'s).

    Raises:
        kubernetes.config.ConfigException: no credentials (the message says what was looked for).
    """
    try:
        use_as_default(connect())
    except LaunchError as exc:
        raise kubernetes.config.ConfigException(str(exc)) from None
