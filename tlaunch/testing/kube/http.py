"""The stand-in API server's HTTP side: routes, replies, chunked watches (what it says of itself, and
``kubectl``'s tables: :mod:`.discovery`)."""

from __future__ import annotations

import json
import queue
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlparse

from tlaunch.testing.kube import portforward
from tlaunch.testing.kube.discovery import discovery, table
from tlaunch.testing.kube.objects import matches

__all__ = ["Handler"]

_PATH = re.compile(
    r"^/(?:api/(?P<v1>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|log|portforward))?$"
)


class Handler(BaseHTTPRequestHandler):
    """One request to the stand-in server (``api``: the :class:`StandInAPIServer` it serves)."""

    api: Any
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

    def _as(self, user: str, method: str, group: str, plural: str, ns: str) -> bool:
        """A request made as ``user`` (``Impersonate-User``): RBAC's answer, as granted (``grant``)."""
        with self.api.store.lock:
            self.api.store.impersonated.append((user, method, plural, ns))
            allowed = ns in self.api.store.grants.get(user, set())
        if not allowed:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
            self._status(
                403,
                "Forbidden",
                f'{plural} is forbidden: User "{user}" cannot {verb.get(method, method.lower())} resource '
                f'"{plural}" in API group "{group}" in the namespace "{ns}"',
            )
        return allowed

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
            user = self.headers.get("Impersonate-User")
            if user is not None and not self._as(user, method, group, plural, ns or ""):
                return
            refusal = _refusal(self.api.store, method, f"{plural}/{sub}" if sub == "portforward" else plural)
            if refusal is not None:  # as RBAC or an admission webhook would answer
                self.rfile.read(int(self.headers.get("Content-Length") or 0))  # the body is not for us
                self._status(
                    refusal[0],
                    refusal[1],
                    f"{method} {plural}{f'/{sub}' if sub else ''} refused: {refusal[1]}",
                )
                return
            if sub == "status" and not has_status:
                self._status(404, "NotFound", f"{plural} has no status subresource")
                return
            if sub == "portforward" and name is not None:
                self._portforward(ns or "default", name, query)
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
        document = discovery(self.api.store, path)
        if document is None:
            return False
        self._send(200, document)
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

    def _portforward(self, ns: str, name: str, query: dict[str, str]) -> None:
        """``pods/portforward``: the WebSocket stream to ports of a running pod (see :mod:`.portforward`)."""
        pod = self.api.get("", "v1", "pods", ns, name)
        if pod is None:
            raise LookupError(f'pods "{name}" not found')
        phase = (pod.get("status") or {}).get("phase")
        if phase != "Running":
            self._status(400, "BadRequest", f"pod {name} is not running (its phase: {phase})")
            return
        ports = [int(p) for p in query.get("ports", "").split(",") if p.strip().isdigit()]
        if not ports or self.headers.get("Upgrade", "").lower() != "websocket":
            self._status(400, "BadRequest", "a port-forward needs ports=PORT[,PORT] and a WebSocket upgrade")
            return
        head = f"{self.requestline}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        self.close_connection = True
        portforward.serve(
            self.connection,
            (head + "\r\n").encode(),
            ports,
            lambda port: socket.create_connection(("127.0.0.1", port), 5.0),
        )

    def _table(self, group: str, plural: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        crds = self.api.list("apiextensions.k8s.io", "customresourcedefinitions", None)
        return table(crds, group, plural, items)

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
                if not matches(obj, selector):
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


def _refusal(store: Any, method: str, plural: str) -> tuple[int, str] | None:
    """The refusal ``StandInAPIServer.refuse`` set for this request, if any (it is used up)."""
    with store.lock:
        for i, (m, p, code, reason) in enumerate(store.refusals):
            if m == method and p == plural:
                del store.refusals[i]
                return code, reason
    return None
