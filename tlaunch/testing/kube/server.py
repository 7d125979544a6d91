"""A stand-in Kubernetes API server, in memory, for tests of the operator, ``tlaunchrun`` and ``kubectl``.

No real API server runs on these machines. This one speaks enough of the API
for the real clients (the ``kubernetes`` package, kopf's aiohttp client,
``kubectl``) to work against it unchanged, through a kubeconfig:

* discovery (``/version``, ``/api``, ``/apis``, each group version's resources,
  ``lpjobs/status`` among them: kopf patches status there only if it is listed);
* per resource: list (label selectors), watch (chunked JSON events from a
  ``resourceVersion``), create, get, replace, patch (JSON merge, strategic
  merge read as merge, and JSON patch), delete; ``status``; ``pods/log``;
  ``pods/portforward`` (the WebSocket protocol, to the pod's port on this machine's
  loopback, where the stand-in kubelet runs pods: :mod:`tlaunch.testing.kube.portforward`);
* ``metadata``: ``uid``, ``resourceVersion`` (one counter), ``generation``, ``creationTimestamp``;
  deletion waits for ``finalizers`` (a ``deletionTimestamp`` is set); deleting an owner deletes
  what it owns (the garbage collector's job, done at once);
* ``kubectl get`` tables: the CRD's printer columns for custom resources.

No scheduler or kubelet: a test plays the kubelet (``set_pod_phase``, or
:mod:`tlaunch.testing.kube.kubelet`) and RBAC (``refuse``; ``grant``: the
namespaces a user impersonated with ``Impersonate-User`` may use). Not served:
authentication, admission, server-side apply, field selectors, OpenAPI
(``kubectl`` needs ``--validate=false``).
"""

from __future__ import annotations

import copy
import json
import os
import queue
import tempfile
import threading
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

from tlaunch.testing.kube.http import Handler as HTTPHandler
from tlaunch.testing.kube.objects import json_patch, matches, merge_patch, now
from tlaunch.testing.kube.store import Store

__all__ = ["StandInAPIServer"]


class StandInAPIServer:
    """The stand-in API server; a context manager. ``kubeconfig`` points the clients at it.

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        kubeconfig: a kubeconfig file for it (``KUBECONFIG=...``).
    """

    def __init__(self) -> None:
        self.store = Store()
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

        class Handler(HTTPHandler):
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
            meta.update(uid=str(uuid.uuid4()), resourceVersion=self.store.bump(), creationTimestamp=now())
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
                if g == group and p == plural and (ns is None or n == ns) and matches(o, selector)
            )

    def list(
        self, group: str, plural: str, ns: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Objects of a resource (``ns`` None: every namespace), by label selector."""
        with self.store.lock:
            return [
                copy.deepcopy(o)
                for (g, p, n, _), o in sorted(self.store.objects.items())
                if g == group and p == plural and (ns is None or n == ns) and matches(o, selector)
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
                    obj["metadata"]["deletionTimestamp"] = now()
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

    # -- what a test does in RBAC's or a kubelet's place -----------------------
    def grant(self, user: str, namespace: str) -> None:
        """Let requests made as ``user`` (``Impersonate-User``) use ``namespace``: any other namespace
        is refused to them (403), as RBAC refuses what no role binding grants."""
        with self.store.lock:
            self.store.grants.setdefault(user, set()).add(namespace)

    @property
    def impersonated(self) -> tuple[tuple[str, str, str, str], ...]:
        """Every request made as another user: (user, method, plural, namespace)."""
        with self.store.lock:
            return tuple(self.store.impersonated)

    def refuse(self, method: str, plural: str, code: int = 403, reason: str = "Forbidden") -> None:
        """Answer the next ``method`` request on ``plural`` (``PATCH``, ``secrets``; ``GET``,
        ``pods/portforward``) with ``code``, once."""
        with self.store.lock:
            self.store.refusals.append((method.upper(), plural, code, reason))

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
                {**base, "ready": True, "state": {"running": {"startedAt": now()}}}
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
