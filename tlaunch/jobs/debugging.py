"""A paused node of a server's job, debugged from here through the server (``tlaunch job debug``).

The job's run key stays on the server; the server opens the node's pdb for the job's
owner and relays it over a WebSocket (:mod:`tlaunch.server.debugging`). Here the
WebSocket is turned into a local socket pair, so the pdb terminal of ``tlaunch debug``
(:mod:`tlaunch.runtime.debugger.terminal`) serves both::

    from tlaunch.jobs import Client

    with Client() as c:
        for p in c.paused("train"):                   # what waits, and where
            print(p["node"], p["host"], p["at"])
        session = c.debug("train", "learner/0")        # session.sock: pdb's terminal
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from tlaunch.errors import TLaunchError
from tlaunch.jobs.errors import JobServerError

__all__ = ["RemoteSession", "open_session"]

_GREETING_AFTER_WAIT = 60.0  # s beyond the node's own wait for the server's first word


@dataclass
class RemoteSession:
    """A debugger session relayed by the job server.

    Attributes:
        greeting: the node's first line (``tlaunch: attached to learner/0 on th3 ...``).
        sock: this end of the session: write lines to pdb, read its output (closing it ends
            the session: the node goes on).
    """

    greeting: str
    sock: socket.socket
    _ws: Any = field(repr=False)
    _threads: list[threading.Thread] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """End the session (the node goes on); idempotent."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(Exception):
            self._ws.close()
        for t in self._threads:
            t.join(2.0)


def open_session(
    url: str, token: str | None, path: str, params: dict[str, str], node: str, wait: float
) -> RemoteSession:
    """Open node ``node``'s pdb of the job at ``path`` (``/v1/jobs/<name>``) through the server at ``url``.

    Raises:
        JobServerError: the server refused (its status and why: no such job or node, not paused,
            too many sessions), or cannot be reached.
    """
    try:
        from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
        from websockets.sync.client import connect
    except ImportError:
        raise TLaunchError(
            "debugging through the job server needs websockets: pip install 'tlaunch[server]'"
        ) from None
    scheme, _, rest = url.partition("://")
    query = urlencode({"node": node, "wait": str(wait), **params})
    ws_url = f"{'wss' if scheme == 'https' else 'ws'}://{rest}{path}/debug?{query}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    tls = ssl.create_default_context() if scheme == "https" else None
    try:
        ws = connect(ws_url, additional_headers=headers, ssl=tls, open_timeout=30, max_size=None)
    except InvalidStatus as exc:
        raise JobServerError(
            exc.response.status_code, f"the server refused the debugger's connection: {exc}"
        ) from None
    except (OSError, TimeoutError, WebSocketException) as exc:
        raise JobServerError(0, f"cannot reach the job server at {url}: {exc}") from None
    try:
        first = json.loads(ws.recv(timeout=wait + _GREETING_AFTER_WAIT))
    except (ConnectionClosed, TimeoutError, ValueError) as exc:
        ws.close()
        raise JobServerError(0, f"the job server ended the debugger's connection: {exc}") from None
    if "error" in first:
        ws.close()
        raise JobServerError(int(first.get("status", 0)), str(first["error"]))
    here, there = socket.socketpair()
    session = RemoteSession(str(first["greeting"]), here, ws)
    session._threads = [
        threading.Thread(target=_from_server, args=(ws, there, ConnectionClosed), daemon=True),
        threading.Thread(target=_to_server, args=(ws, there), daemon=True),
    ]
    for t in session._threads:
        t.start()
    return session


def _from_server(ws: Any, there: socket.socket, closed: type[Exception]) -> None:
    """pdb's output, from the server to this end's pair, until the server closes."""
    try:
        for message in ws:
            there.sendall(message if isinstance(message, bytes) else message.encode())
    except (closed, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            there.shutdown(socket.SHUT_WR)  # the terminal sees the session end


def _to_server(ws: Any, there: socket.socket) -> None:
    """What the terminal writes, to the server, until the terminal closes its end."""
    try:
        while True:
            data = there.recv(65536)
            if not data:
                break
            ws.send(data)
    except Exception:
        pass
    finally:
        with contextlib.suppress(Exception):
            ws.close()
        with contextlib.suppress(OSError):
            there.close()
