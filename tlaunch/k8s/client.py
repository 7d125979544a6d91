"""The one place that finds a Kubernetes cluster's credentials: :func:`connect`.

Every user of the API goes through it: the ``k8s`` backend and its handles
(``launch(..., launch_type="k8s")``, ``lp_k8s``), ``tlaunchrun``,
``tlaunch.control``, :mod:`tlaunch.k8s.incluster` and the operator's own
client. The credentials come from, in order:

1. ``kube_config``, a kubeconfig file named by the caller (``lp_k8s.launch(...,
   kube_config=...)``, a run's record); it must exist;
2. the kubeconfig files of ``$KUBECONFIG`` (several joined by ``:``, as kubectl
   reads them), else ``~/.kube/config``: those that exist;
3. the pod's service account, inside a cluster (``$KUBERNETES_SERVICE_HOST``, and
   the token and CA of ``/var/run/secrets/kubernetes.io/serviceaccount``, or of
   the folder ``$TLAUNCH_SERVICE_ACCOUNT_DIR`` names: tests point it elsewhere).

The client it returns has a configuration of its own: the ``kubernetes``
package's process-wide default is left alone (two clusters can be used from
one process), except by :func:`use_as_default`, which the operator calls.
Needs ``pip install 'tlaunch[k8s]'``.

A job's namespace is decided here too, by one rule (:func:`namespace_of`): the
one the user names, else the credentials' own: the service account's in a pod,
else the current context's of the kubeconfig, else ``default``. Submitting a
job, finding it again (``tlaunchrun status NAME``), a program's launch
(``launch_type="k8s"``) and a dry run's manifests all ask it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.extras import require

__all__ = [
    "IN_CLUSTER",
    "Kube",
    "SERVICE_ACCOUNT_DIR",
    "SERVICE_ACCOUNT_DIR_ENV",
    "connect",
    "namespace_of",
    "service_account_dir",
    "use_as_default",
]

IN_CLUSTER = "in-cluster"
""":attr:`Kube.source` of credentials that are the pod's service account."""
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_ACCOUNT_DIR_ENV = "TLAUNCH_SERVICE_ACCOUNT_DIR"


def service_account_dir() -> str:
    """The folder of the pod's service account (``$TLAUNCH_SERVICE_ACCOUNT_DIR``, else Kubernetes' own)."""
    return os.environ.get(SERVICE_ACCOUNT_DIR_ENV) or SERVICE_ACCOUNT_DIR


@dataclass(frozen=True)
class Kube:
    """A connection to one cluster, as :func:`connect` found it.

    Attributes:
        api: the ``kubernetes.client.ApiClient`` (its own configuration).
        core: ``CoreV1Api`` over it (pods, secrets, logs).
        custom: ``CustomObjectsApi`` over it (LPJobs).
        ApiException: the client's error type (``.status``, ``.reason``, ``.body``).
        namespace: the credentials' own namespace (:func:`namespace_of`).
        source: where the credentials came from: the kubeconfig file(s) read, or
            :data:`IN_CLUSTER`.
        kube_config: the kubeconfig file(s) read (None: in-cluster), to find the
            same cluster again from another process.
    """

    api: Any
    core: Any
    custom: Any
    ApiException: type[Exception]
    namespace: str
    source: str
    kube_config: str | None

    def namespace_for(self, given: str | None) -> str:
        """The namespace of a job that names ``given`` (None: these credentials' own)."""
        return given or self.namespace

    def refused(self, what: str, exc: BaseException) -> LaunchError:
        """A :class:`LaunchError` for an API call that failed: ``what`` and the server's answer."""
        status = getattr(exc, "status", None)
        reason = getattr(exc, "reason", None) or str(exc)
        body = str(getattr(exc, "body", "") or "")[:500]
        said = f"{status} {reason}" if status else reason
        return LaunchError(f"{what}: {said}" + (f": {body}" if body else ""))


def connect(kube_config: str | None = None, impersonate: str | None = None) -> Kube:
    """A client of the cluster (see the module docstring for where the credentials come from); with
    ``impersonate``, every request asks the API server to act as that user (``Impersonate-User``: its
    RBAC decides, and the credentials need ``impersonate`` on users).

    Raises:
        MissingExtraError: the kubernetes client is not installed.
        LaunchError: no credentials were found, or they cannot be read (the message
            says where it looked and how to fix it).
    """
    kubernetes = require("kubernetes", "Kubernetes (the k8s backend, lp_k8s, tlaunchrun)")
    configuration = kubernetes.client.Configuration()
    if kube_config is not None:
        if not os.path.isfile(os.path.expanduser(kube_config)):
            raise LaunchError(f"kube_config={kube_config!r} is not a file; give the path of a kubeconfig")
        listed = kube_config
    else:
        listed = os.environ.get("KUBECONFIG") or "~/.kube/config"
    files = ":".join(
        os.path.abspath(os.path.expanduser(f)) for f in listed.split(os.pathsep) if f and _exists(f)
    )
    if files:
        try:
            kubernetes.config.load_kube_config(
                config_file=files, client_configuration=configuration, persist_config=False
            )
        except (kubernetes.config.ConfigException, OSError, ValueError, TypeError) as exc:
            raise LaunchError(f"cannot use the kubeconfig {files}: {exc}") from None
        return _kube(kubernetes, configuration, namespace_of(None, kube_config), files, files, impersonate)
    account = service_account_dir()
    token, ca = os.path.join(account, "token"), os.path.join(account, "ca.crt")
    if not os.environ.get("KUBERNETES_SERVICE_HOST") or not os.path.isfile(token):
        raise LaunchError(
            f"no Kubernetes cluster to talk to: no kubeconfig at {listed} and not in a pod (no service "
            f"account token at {token}); pass kube_config='path/to/kubeconfig' or set KUBECONFIG"
        )
    loader = kubernetes.config.incluster_config.InClusterConfigLoader(token_filename=token, cert_filename=ca)
    try:
        loader.load_and_set(client_configuration=configuration)
    except kubernetes.config.ConfigException as exc:
        raise LaunchError(f"this pod's service account ({account}) cannot be used: {exc}") from None
    return _kube(kubernetes, configuration, namespace_of(None, kube_config), IN_CLUSTER, None, impersonate)


def use_as_default(kube: Kube) -> None:
    """Make ``kube``'s configuration the kubernetes package's default (for code that builds its own APIs)."""
    kubernetes = require("kubernetes", "Kubernetes")
    kubernetes.client.Configuration.set_default(kube.api.configuration)


def _kube(
    kubernetes: Any,
    configuration: Any,
    namespace: str,
    source: str,
    files: str | None,
    impersonate: str | None,
) -> Kube:
    api = kubernetes.client.ApiClient(configuration)
    if impersonate is not None:
        api.set_default_header("Impersonate-User", impersonate)
    return Kube(
        api=api,
        core=kubernetes.client.CoreV1Api(api),
        custom=kubernetes.client.CustomObjectsApi(api),
        ApiException=kubernetes.client.ApiException,
        namespace=namespace,
        source=source,
        kube_config=files,
    )


def _exists(path: str) -> bool:
    return os.path.isfile(os.path.expanduser(path))


def namespace_of(given: str | None = None, kube_config: str | None = None) -> str:
    """The one namespace rule: ``given`` when the user names one, else the credentials' own.

    The credentials' own is, in order: the service account's in a pod (its
    ``namespace`` file, as :mod:`tlaunch.k8s.incluster` tells a pod), unless
    ``kube_config`` names a kubeconfig; the current context's of the kubeconfig
    (``kube_config``, else ``$KUBECONFIG``'s files, else ``~/.kube/config``);
    else ``default``. Nothing is asked of a cluster: a dry run gets the same answer.

    Raises:
        LaunchError: a kubeconfig that cannot be read.
    """
    if given:
        return given
    if kube_config is None:
        try:
            with open(os.path.join(service_account_dir(), "namespace")) as f:
                in_pod = f.read().strip()
        except OSError:
            in_pod = ""
        if in_pod:
            return in_pod
    return _context_namespace(kube_config or os.environ.get("KUBECONFIG") or "~/.kube/config") or "default"


def _context_namespace(listed: str) -> str | None:
    """The namespace of the current context of the kubeconfig files ``listed`` (``a:b``, as kubectl
    merges them: the first file to set a value wins)."""
    paths = [os.path.expanduser(f) for f in listed.split(os.pathsep) if f and _exists(f)]
    if not paths:
        return None
    yaml = require("yaml", "Kubernetes (reading a kubeconfig)")
    current: str | None = None
    namespaces: dict[str, object] = {}
    for path in paths:
        try:
            with open(path) as f:
                config = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise LaunchError(f"cannot read the kubeconfig {path}: {exc}") from None
        current = current or config.get("current-context")
        for context in config.get("contexts") or []:
            namespaces.setdefault(str(context.get("name")), (context.get("context") or {}).get("namespace"))
    found = namespaces.get(current or "")
    return str(found) if found else None
