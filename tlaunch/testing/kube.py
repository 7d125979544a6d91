"""A stand-in Kubernetes API server, in memory, for tests of the operator, ``tlaunchrun`` and ``kubectl``.

No real API server runs on these machines. This one speaks enough of the API
for the real clients (the ``kubernetes`` package, kopf's aiohttp client,
``kubectl``) to work against it unchanged, through a kubeconfig:

* discovery (``/version``, ``/api``, ``/apis``, each group version's resources,
  ``lpjobs/status`` among them: kopf patches status there only if it is listed);
* per resource: list (label selectors), watch (chunked JSON events from a
  ``resourceVersion``), create, get, replace, patch (JSON merge, strategic
  merge read as merge, and JSON patch), delete; the ``status`` subresource;
  ``pods/log``;
* ``metadata``: ``uid``, ``resourceVersion`` (one counter), ``generation``,
  ``creationTimestamp``; deletion waits for ``finalizers`` (a
  ``deletionTimestamp`` is set); deleting an owner deletes what it owns (the
  garbage collector's job, done at once);
* ``kubectl get`` tables: the CRD's printer columns for custom resources.

There is no scheduler and no kubelet: a test plays the kubelet with
:meth:`StandInAPIServer.set_pod_phase`. Not served: authentication,
admission, server-side apply, field selectors, OpenAPI (``kubectl`` needs
``--validate=false``).
"""

from __future__ import annotations

import copy
import json
import os
import queue
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

__all__ = ["StandInAPIServer"]

# (group, version, plural) -> (kind, namespaced, has status subresource)
_BUILTIN: dict[tuple[str, str, str], tuple[str, bool, bool]] = {
    ("", "v1", "pods"): ("Pod", True, True),
    ("", "v1", "services"): ("Service", True, True),
    ("", "v1", "configmaps"): ("ConfigMap", True, False),
    ("", "v1", "secrets"): ("Secret", True, False),
    ("", "v1", "events"): ("Event", True, False),
    ("", "v1", "namespaces"): ("Namespace", False, True),
    ("", "v1", "serviceaccounts"): ("ServiceAccount", True, False),
    ("", "v1", "persistentvolumeclaims"): ("PersistentVolumeClaim", True, True),
    ("", "v1", "resourcequotas"): ("ResourceQuota", True, True),
    ("apps", "v1", "deployments"): ("Deployment", True, True),
    ("scheduling.volcano.sh", "v1beta1", "podgroups"): ("PodGroup", True, True),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): ("CustomResourceDefinition", False, True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"): ("ClusterRole", False, False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"): ("ClusterRoleBinding", False, False),
    ("rbac.authorization.k8s.io", "v1", "roles"): ("Role", True, False),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): ("RoleBinding", True, False),
    ("events.k8s.io", "v1", "events"): ("Event", True, False),
}

_SHORT = {"pods": ["po"], "services": ["svc"], "configmaps": ["cm"], "namespaces": ["ns"],
          "customresourcedefinitions": ["crd", "crds"], "persistentvolumeclaims": ["pvc"],
          "resourcequotas": ["quota"], "deployments": ["deploy"], "serviceaccounts": ["sa"]}  # fmt: skip

_PATH = re.compile(
    r"^/(?:api/(?P<v1>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|log))?$"
)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of ``target`` (a copy is returned)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(target: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test) of ``target`` (a copy is returned)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = _pointer(op["path"])
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1] if parts else ""
        kind = op["op"]
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                parent.pop(last, None)
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif kind == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        else:
            raise ValueError(f"JSON patch op {kind!r} is not served here")
    return doc


def _matches(obj: dict[str, Any], selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    for raw in selector.split(","):
        term = raw.strip()
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class _Store:
    """Every object, by (group, plural, namespace, name), with one resourceVersion counter and watchers."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.rv = 1
        self.history: list[tuple[int, str, str, str, dict[str, Any]]] = []  # rv, group, plural, type, obj
        self.watchers: list[tuple[str, str, str | None, queue.Queue[Any]]] = []
        self.resources: dict[tuple[str, str, str], tuple[str, bool, bool]] = dict(_BUILTIN)
        self.logs: dict[tuple[str, str], str] = {}
        self.short_names: dict[str, list[str]] = dict(_SHORT)

    def bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def emit(self, group: str, plural: str, kind: str, obj: dict[str, Any]) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        snapshot = copy.deepcopy(obj)
        self.history.append((rv, group, plural, kind, snapshot))
        del self.history[:-5000]
        ns = obj["metadata"].get("namespace")
        for g, p, wns, q in list(self.watchers):
            if g == group and p == plural and (wns is None or wns == ns):
                q.put((kind, snapshot))


class StandInAPIServer:
    """The stand-in API server; a context manager. ``kubeconfig`` points the clients at it.

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        kubeconfig: a kubeconfig file for it (``KUBECONFIG=...``).
    """

    def __init__(self) -> None:
        self.store = _Store()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._dir = tempfile.mkdtemp(prefix="tlaunch-kube-")
        self.url = ""
        self.kubeconfig = os.path.join(self._dir, "kubeconfig")
        self.requests = 0
        self.create("", "v1", "namespaces", None, {"metadata": {"name": "default"}})

    # -- life -------------------------------------------------------------
    def __enter__(self) -> StandInAPIServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Serve on a free loopback port and write the kubeconfig."""
        server = self

        class Handler(_Handler):
            api = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kube-standin", daemon=True)
        self._thread.start()
        with open(self.kubeconfig, "w") as f:
            json.dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                    "users": [{"name": "standin", "user": {"token": "standin"}}],
                    "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin"}}],
                    "current-context": "standin",
                },
                f,
            )

    def stop(self) -> None:
        """Stop serving; open watches end."""
        with self.store.lock:
            for *_, q in self.store.watchers:
                q.put(None)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)

    # -- the API, as objects -------------------------------------------------
    def _key(self, group: str, plural: str, ns: str | None, name: str) -> tuple[str, str, str, str]:
        return (group, plural, ns or "", name)

    def resource(self, group: str, version: str, plural: str) -> tuple[str, bool, bool]:
        """(kind, namespaced, has status) of a served resource.

        Raises:
            KeyError: not served (an unknown group, version or plural).
        """
        return self.store.resources[(group, version, plural)]

    def create(
        self, group: str, version: str, plural: str, ns: str | None, obj: dict[str, Any]
    ) -> dict[str, Any]:
        """Create ``obj``; the stored copy (409 as ``FileExistsError``)."""
        kind, namespaced, _ = self.resource(group, version, plural)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        ns = (ns or meta.get("namespace") or "default") if namespaced else None
        if namespaced:
            meta["namespace"] = ns
            if self.get("", "v1", "namespaces", None, str(ns)) is None and plural != "namespaces":
                raise LookupError(f'namespaces "{ns}" not found')
        with self.store.lock:
            key = self._key(group, plural, ns, meta["name"])
            if key in self.store.objects:
                raise FileExistsError(f'{plural} "{meta["name"]}" already exists')
            obj["apiVersion"] = f"{group}/{version}" if group else version
            obj["kind"] = kind
            meta.update(uid=str(uuid.uuid4()), resourceVersion=self.store.bump(), creationTimestamp=_now())
            meta["generation"] = 1
            if plural == "pods":
                obj.setdefault("status", {"phase": "Pending"})
            if plural == "namespaces":
                obj.setdefault("status", {"phase": "Active"})
            self.store.objects[key] = obj
            if plural == "customresourcedefinitions":
                self._serve_crd(obj)
            self.store.emit(group, plural, "ADDED", obj)
            return copy.deepcopy(obj)

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        for v in spec["versions"]:
            status = "status" in (v.get("subresources") or {})
            key = (spec["group"], v["name"], spec["names"]["plural"])
            self.store.resources[key] = (spec["names"]["kind"], spec["scope"] == "Namespaced", status)
            self.store.short_names[spec["names"]["plural"]] = list(spec["names"].get("shortNames") or [])
        crd["status"] = {
            "acceptedNames": spec["names"],
            "conditions": [{"type": "Established", "status": "True"}],
        }

    def get(self, group: str, version: str, plural: str, ns: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None."""
        with self.store.lock:
            obj = self.store.objects.get(self._key(group, plural, ns, name))
            return copy.deepcopy(obj) if obj is not None else None

    def count(self, group: str, plural: str, ns: str | None, selector: str | None = None) -> int:
        """How many objects :meth:`list` would return (without copying them)."""
        with self.store.lock:
            return sum(
                1
                for (g, p, n, _), o in self.store.objects.items()
                if g == group and p == plural and (ns is None or n == ns) and _matches(o, selector)
            )

    def list(
        self, group: str, plural: str, ns: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Objects of a resource (``ns`` None: every namespace), by label selector."""
        with self.store.lock:
            return [
                copy.deepcopy(o)
                for (g, p, n, _), o in sorted(self.store.objects.items())
                if g == group and p == plural and (ns is None or n == ns) and _matches(o, selector)
            ]

    def update(
        self,
        group: str,
        plural: str,
        ns: str | None,
        name: str,
        new: dict[str, Any],
        status_only: bool = False,
    ) -> dict[str, Any]:
        """Store ``new`` (a whole object) as the object's next version."""
        with self.store.lock:
            key = self._key(group, plural, ns, name)
            old = self.store.objects.get(key)
            if old is None:
                raise LookupError(f'{plural} "{name}" not found')
            new = copy.deepcopy(new)
            if status_only:
                merged = copy.deepcopy(old)
                merged["status"] = new.get("status", {})
                new = merged
            else:
                new["status"] = (
                    new.get("status", old.get("status")) if plural in ("pods",) else old.get("status")
                )
                if new.get("status") is None:
                    new.pop("status", None)
                if new.get("spec") != old.get("spec"):
                    new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            for field in ("uid", "creationTimestamp", "namespace", "name"):
                if field in old["metadata"]:
                    new["metadata"][field] = old["metadata"][field]
            if "deletionTimestamp" in old["metadata"]:
                new["metadata"]["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
            new["metadata"]["resourceVersion"] = self.store.bump()
            new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                del self.store.objects[key]
                self.store.emit(group, plural, "DELETED", new)
                self._collect(new["metadata"]["uid"])
                return copy.deepcopy(new)
            self.store.objects[key] = new
            self.store.emit(group, plural, "MODIFIED", new)
            return copy.deepcopy(new)

    def patch(
        self,
        group: str,
        plural: str,
        ns: str | None,
        name: str,
        body: Any,
        kind: str,
        status_only: bool = False,
    ) -> dict[str, Any]:
        """Apply a patch (``kind``: ``json``, ``merge`` or ``strategic``, read as merge)."""
        with self.store.lock:
            old = self.store.objects.get(self._key(group, plural, ns, name))
            if old is None:
                raise LookupError(f'{plural} "{name}" not found')
            new = json_patch(old, body) if kind == "json" else merge_patch(old, body)
            if not status_only and plural not in ("pods",):
                new["status"] = old.get("status")
                if new["status"] is None:
                    new.pop("status")
            return self.update(group, plural, ns, name, new, status_only=status_only)

    def delete(self, group: str, plural: str, ns: str | None, name: str) -> dict[str, Any]:
        """Delete (or, while finalizers remain, mark for deletion) the object."""
        with self.store.lock:
            key = self._key(group, plural, ns, name)
            obj = self.store.objects.get(key)
            if obj is None:
                raise LookupError(f'{plural} "{name}" not found')
            if obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = _now()
                    obj["metadata"]["resourceVersion"] = self.store.bump()
                    self.store.emit(group, plural, "MODIFIED", obj)
                return copy.deepcopy(obj)
            del self.store.objects[key]
            obj["metadata"]["resourceVersion"] = self.store.bump()
            self.store.emit(group, plural, "DELETED", obj)
            self._collect(obj["metadata"]["uid"])
            return copy.deepcopy(obj)

    def _collect(self, uid: str) -> None:
        """The garbage collector: what ``uid`` owned goes too."""
        owned = [
            (g, p, n, name)
            for (g, p, n, name), o in self.store.objects.items()
            if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or [])
        ]
        for g, p, n, name in owned:
            if (g, p, n, name) in self.store.objects:
                self.delete(g, p, n or None, name)

    # -- what a test does in a kubelet's place --------------------------------
    def set_pod_phase(
        self, ns: str, name: str, phase: str, exit_code: int | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Set a pod's phase (``Running``, ``Succeeded``, ``Failed``), as a kubelet would."""
        pod = self.get("", "v1", "pods", ns, name)
        if pod is None:
            raise LookupError(f"no pod {ns}/{name}")
        status: dict[str, Any] = {"phase": phase}
        container = pod["spec"]["containers"][0]
        base = {
            "name": container["name"],
            "image": container.get("image", ""),
            "imageID": "",
            "restartCount": 0,
        }
        if phase == "Running":
            status["conditions"] = [{"type": "Ready", "status": "True"}]
            status["containerStatuses"] = [
                {**base, "ready": True, "state": {"running": {"startedAt": _now()}}}
            ]
        if phase in ("Succeeded", "Failed"):
            term: dict[str, Any] = {
                "exitCode": exit_code if exit_code is not None else int(phase == "Failed")
            }
            if reason:
                term["reason"] = reason
            status["containerStatuses"] = [{**base, "ready": False, "state": {"terminated": term}}]
        return self.patch("", "pods", ns, name, {"status": status}, "merge", status_only=True)

    def set_pod_log(self, ns: str, name: str, text: str) -> None:
        """What ``pods/log`` returns for the pod."""
        self.store.logs[(ns, name)] = text

    def watch(
        self, group: str, plural: str, ns: str | None, since: int | None, q: queue.Queue[Any] | None = None
    ) -> Iterator[Any]:
        """Events of a resource after ``since``; ends when the server stops (or None is put on ``q``)."""
        q = q if q is not None else queue.Queue()
        with self.store.lock:
            if since is None:  # no resourceVersion: the current state first, as ADDED events
                for o in self.list(group, plural, ns):
                    q.put(("ADDED", o))
            else:
                for rv, g, p, kind, obj in self.store.history:
                    if (
                        rv > since
                        and g == group
                        and p == plural
                        and (ns is None or obj["metadata"].get("namespace") == ns)
                    ):
                        q.put((kind, obj))
            entry = (group, plural, ns, q)
            self.store.watchers.append(entry)
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                yield item
        finally:
            with self.store.lock:
                self.store.watchers.remove(entry)


class _Handler(BaseHTTPRequestHandler):
    api: StandInAPIServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go as two writes: no 40 ms delayed-ACK stall

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- replies ------------------------------------------------------------
    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": message,
                "reason": reason,
                "code": code,
            },
        )

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

    # -- routing ------------------------------------------------------------
    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def _route(self, method: str) -> None:
        self.api.requests += 1
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path.rstrip("/")
        try:
            if method == "GET" and self._discovery(path):
                return
            m = _PATH.match(path)
            if m is None:
                self._status(404, "NotFound", f"the server could not find the requested resource ({path})")
                return
            group = m.group("group") or ""
            version = m.group("v1") or m.group("version")
            plural, name, sub, ns = m.group("plural"), m.group("name"), m.group("sub"), m.group("ns")
            try:
                kind, _, has_status = self.api.resource(group, version, plural)
            except KeyError:
                self._status(404, "NotFound", f"the server could not find the requested resource ({path})")
                return
            if sub == "status" and not has_status:
                self._status(404, "NotFound", f"{plural} has no status subresource")
                return
            self._resource(method, group, version, plural, kind, ns, name, sub, query)
        except LookupError as exc:
            self._status(404, "NotFound", str(exc).strip("'\""))
        except FileExistsError as exc:
            self._status(409, "AlreadyExists", str(exc))
        except (ValueError, KeyError, TypeError) as exc:
            self._status(422, "Invalid", f"{type(exc).__name__}: {exc}")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _discovery(self, path: str) -> bool:
        store = self.api.store
        if path == "/version":
            self._send(
                200,
                {
                    "major": "1",
                    "minor": "32",
                    "gitVersion": "v1.32.0-tlaunch-standin",
                    "platform": "linux/amd64",
                },
            )
        elif path == "/api":
            self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        elif path == "/apis":
            groups: dict[str, list[str]] = {}
            for g, v, _ in store.resources:
                if g:
                    groups.setdefault(g, [])
                    if v not in groups[g]:
                        groups[g].append(v)
            self._send(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                            "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                        }
                        for g, vs in sorted(groups.items())
                    ],
                },
            )
        elif path == "/api/v1" or re.match(r"^/apis/[^/]+/[^/]+$", path):
            group, version = ("", "v1") if path == "/api/v1" else tuple(path.split("/")[2:4])
            resources = []
            for (g, v, plural), (kind, namespaced, status) in sorted(store.resources.items()):
                if (g, v) != (group, version):
                    continue
                verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
                resources.append(
                    {
                        "name": plural,
                        "singularName": kind.lower(),
                        "namespaced": namespaced,
                        "kind": kind,
                        "verbs": verbs,
                        "shortNames": store.short_names.get(plural, []),
                    }
                )
                if status:
                    resources.append(
                        {
                            "name": f"{plural}/status",
                            "singularName": "",
                            "namespaced": namespaced,
                            "kind": kind,
                            "verbs": ["get", "patch", "update"],
                        }
                    )
                if plural == "pods":
                    resources.append(
                        {
                            "name": "pods/log",
                            "singularName": "",
                            "namespaced": True,
                            "kind": "Pod",
                            "verbs": ["get"],
                        }
                    )
            if not resources:
                self._status(404, "NotFound", f"no group version {group}/{version}")
                return True
            gv = f"{group}/{version}" if group else version
            self._send(
                200,
                {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources},
            )
        else:
            return False
        return True

    def _resource(
        self,
        method: str,
        group: str,
        version: str,
        plural: str,
        kind: str,
        ns: str | None,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
    ) -> None:
        api = self.api
        if name is None:
            if method == "GET" and query.get("watch") in ("true", "1"):
                self._watch(group, plural, ns, query)
            elif method == "GET":
                items = api.list(group, plural, ns, query.get("labelSelector"))
                body = {
                    "kind": f"{kind}List",
                    "apiVersion": f"{group}/{version}" if group else version,
                    "metadata": {"resourceVersion": str(api.store.rv)},
                    "items": items,
                }
                if "as=Table" in (self.headers.get("Accept") or ""):
                    body = self._table(group, plural, items)
                self._send(200, body)
            elif method == "POST":
                self._send(201, api.create(group, version, plural, ns, self._body()))
            else:
                self._status(405, "MethodNotAllowed", f"{method} on a collection")
            return
        if sub == "log":
            self._send(200, api.store.logs.get((ns or "", name), "").encode(), "text/plain")
            return
        status_only = sub == "status"
        if method == "GET":
            obj = api.get(group, version, plural, ns, name)
            if obj is None:
                raise LookupError(f'{plural} "{name}" not found')
            if "as=Table" in (self.headers.get("Accept") or ""):
                obj = self._table(group, plural, [obj])
            self._send(200, obj)
        elif method == "PUT":
            self._send(200, api.update(group, plural, ns, name, self._body(), status_only=status_only))
        elif method == "PATCH":
            ctype = self.headers.get("Content-Type", "")
            kind_of = "json" if "json-patch" in ctype else "strategic" if "strategic" in ctype else "merge"
            self._send(
                200, api.patch(group, plural, ns, name, self._body(), kind_of, status_only=status_only)
            )
        elif method == "DELETE":
            self._send(200, api.delete(group, plural, ns, name))
        else:
            self._status(405, "MethodNotAllowed", method)

    def _table(self, group: str, plural: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        """``kubectl get``'s table: the CRD's printer columns for a custom resource, else name and age."""
        columns = [{"name": "Name", "type": "string", "format": "name"}]
        paths: list[str] = []
        for crd in self.api.list("apiextensions.k8s.io", "customresourcedefinitions", None):
            spec = crd["spec"]
            if spec["group"] == group and spec["names"]["plural"] == plural:
                for col in spec["versions"][0].get("additionalPrinterColumns", []):
                    columns.append({"name": col["name"], "type": col["type"], "format": ""})
                    paths.append(col["jsonPath"])
        if not paths:
            columns.append({"name": "Age", "type": "date", "format": ""})
            paths.append(".metadata.creationTimestamp")
        rows = []
        for obj in items:
            cells: list[Any] = [obj["metadata"]["name"]]
            for p in paths:
                value: Any = obj
                for part in p.strip(".").split("."):
                    value = value.get(part) if isinstance(value, dict) else None
                if p.endswith("creationTimestamp") and isinstance(value, str):
                    made = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
                    value = f"{int((datetime.now(timezone.utc) - made).total_seconds())}s"
                cells.append(value if value is not None else "")
            rows.append(
                {
                    "cells": cells,
                    "object": {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj["metadata"],
                    },
                }
            )
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {},
            "columnDefinitions": columns,
            "rows": rows,
        }

    def _watch(self, group: str, plural: str, ns: str | None, query: dict[str, str]) -> None:
        timeout = float(query.get("timeoutSeconds") or 3600)
        since = query.get("resourceVersion")
        selector = query.get("labelSelector")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + timeout
        q: queue.Queue[Any] = queue.Queue()
        events = self.api.watch(group, plural, ns, int(since) if since and since.isdigit() else None, q)
        stop = threading.Event()

        def closer() -> None:  # end the watch at its timeout even when nothing happens
            if not stop.wait(max(0.0, deadline - time.monotonic())):
                q.put(None)

        threading.Thread(target=closer, daemon=True).start()
        try:
            for kind, obj in events:
                if not _matches(obj, selector):
                    continue
                line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
                if time.monotonic() > deadline:
                    break
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            stop.set()
            self.close_connection = True
