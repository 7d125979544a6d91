"""What the server refuses before a route runs: bodies over a limit, unknown hosts, cross-origin writes.

A pure ASGI middleware (no buffering, nothing read that it refuses):

- **Body size.** A request whose ``Content-Length`` is over its limit is
  answered 413 before a byte of its body is read; one without it (chunked) is
  counted as it arrives and answered 413 the moment it passes the limit, its
  route given a disconnect instead of the rest. JSON requests have
  ``max_body`` (``--max-request-kb``, 1 MiB by default); package uploads
  (``upload_path``) their own, larger limit.
- **Host.** With ``hosts`` given (the names the server is reached by), a
  request naming another ``Host`` is refused (400): a page of another site
  whose name was made to point at this machine (DNS rebinding) cannot talk
  to it.
- **Origin.** With ``same_origin`` (a server without tokens, where any page
  a local browser opens could otherwise write to it), a write (POST, PUT,
  PATCH, DELETE) that a browser marks as coming from another origin
  (``Origin``, ``Sec-Fetch-Site``) is refused (403). A WebSocket (the
  debugger's) is a write: its handshake is refused the same way, and for
  another ``Host``.

Every refusal has the server's one error shape.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

__all__ = ["Guard"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_LINGER, _IDLE, _LINGER_BYTES = 5.0, 0.5, 64 << 20
"""How long (seconds, idle seconds) and how much a refused request's body is still read and dropped."""
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CROSS = (
    "a write from another origin (a web page of another site): this server has no tokens, so it takes "
    "writes only from its own pages and from clients that are not browsers"
)
_CODES = {400: "bad_request", 403: "forbidden", 413: "too_large"}


class Guard:
    """The middleware (see the module docstring).

    Args:
        app: the application it guards.
        max_body: the largest body of a request, in bytes.
        upload_path: the path whose POST bodies (packages) have ``max_upload`` instead.
        max_upload: the largest package upload.
        hosts: the ``Host`` names (without port) the server answers to; empty: any.
        same_origin: refuse cross-origin writes (a server without tokens).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body: int,
        upload_path: str,
        max_upload: int,
        hosts: Collection[str] = (),
        same_origin: bool = False,
    ) -> None:
        self.app = app
        self.max_body = max_body
        self.upload_path = upload_path
        self.max_upload = max_upload
        self.hosts = frozenset(h.lower() for h in hosts)
        self.same_origin = same_origin

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket's handshake, refused (closed before it is accepted: HTTP 403) for another
        ``Host`` or a cross-origin page; else the application's."""
        if _refused_websocket(scope, self.hosts, self.same_origin):
            message = await receive()  # websocket.connect
            if message.get("type") == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008, "reason": "refused: Host or Origin"})
            return
        await self.app(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        host = headers.get("host", "")
        if self.hosts and _hostname(host) not in self.hosts:
            names = sorted(self.hosts)
            await _refuse(
                send, 400, f"Host {host!r} is not a name of this server ({names}; --server-name)", receive
            )
            return
        method = scope.get("method", "GET")
        if self.same_origin and method in _WRITES and _cross_origin(headers, host):
            await _refuse(send, 403, _CROSS, receive)
            return
        limit = self.max_upload if scope.get("path") == self.upload_path else self.max_body
        said = headers.get("content-length", "")
        if said.isdigit() and int(said) > limit:
            await _refuse(send, 413, _too_large(int(said), limit), receive)
            return
        body = _Body(receive, send, limit)
        await self.app(scope, body.receive, body.send)
        if body.refused:  # answered once the route has let go of what it had (an upload's file)
            await _refuse(send, 413, _too_large(body.size, limit, sure=False), receive)


class _Body:
    """A request's body counted as it arrives; past ``limit``, the route sees a disconnect and its
    own answer is dropped (the guard answers 413 once the route has returned)."""

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self._receive = receive
        self._send = send
        self.limit = limit
        self.size = 0
        self.refused = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request" and not self.refused:
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                self.refused = True
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if not self.refused:
            await self._send(message)


def _too_large(size: int, limit: int, sure: bool = True) -> str:
    return (
        f"the request's body is {'' if sure else 'more than '}{size} bytes; the limit is {limit} "
        "(--max-request-kb for JSON, --max-package-mb for packages)"
    )


def _hostname(host: str) -> str:
    """``host`` of a ``Host`` header, without its port (``[::1]:80`` -> ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _refused_websocket(scope: Scope, hosts: Collection[str], same_origin: bool) -> bool:
    """Whether a WebSocket's handshake names another ``Host``, or (``same_origin``) comes from a
    page of another origin: a browser opens a WebSocket to any site, and it is always a write."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
    host = headers.get("host", "")
    if hosts and _hostname(host) not in hosts:
        return True
    return same_origin and _cross_origin(headers, host)


def _cross_origin(headers: dict[str, str], host: str) -> bool:
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return True
    origin = headers.get("origin")
    if origin is None:
        return False
    return origin == "null" or origin.partition("://")[2].rstrip("/").lower() != host.strip().lower()


async def _refuse(send: Send, status: int, message: str, receive: Receive) -> None:
    """Answer ``status``, then read and drop what the client still sends (a few seconds, some MiB at
    most) before the connection closes: closed on unread data, it would be reset, and the client could
    lose the answer."""
    body = json.dumps({"error": {"status": status, "code": _CODES[status], "message": message}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await _drain(receive)
    await send({"type": "http.response.body", "body": b""})


async def _drain(receive: Receive) -> None:
    loop = asyncio.get_running_loop()
    deadline, drained = loop.time() + _LINGER, 0
    while drained < _LINGER_BYTES and (left := deadline - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), min(_IDLE, left))
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request":
            return
        drained += len(message.get("body", b""))
        if not message.get("more_body", False):
            return
