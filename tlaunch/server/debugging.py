"""Debugging a server's job from the user's machine: ``tlaunch job debug NAME [NODE]``.

A job the server launched holds its run's key in the server's run store (the user's,
under ``--unix-users``): a user of the server, elsewhere, has no key to open a paused
node's pdb with (:mod:`tlaunch.control.debug`). The server opens it for them, the
owner of the job (or an admin), and relays the session::

    tlaunch job debug (user's machine)      server                        the paused node
    ───────────────────────────────────     ──────────────────────────     ────────────────
    GET  /v1/jobs/<name>/paused ─────────▶  debug.paused(its run)
    WS   /v1/jobs/<name>/debug?node= ────▶  debug.connect(run, node)  ──▶  pdb, over the run's
         bearer token, Host and Origin       (the run's mutual TLS)         mutual TLS
         checked at the handshake
    ◀── {"greeting": ...}, then pdb's bytes both ways; either side closing ends the session
        (the node goes on, as ``q`` or a lost terminal lets it).

Each session takes two threads of a pool of its own (never the routes' threadpool)
and a user holds at most :data:`SESSIONS_PER_USER` at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
from anyio.to_thread import run_sync
from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from tlaunch.control import RunHandle
from tlaunch.control import debug as control_debug
from tlaunch.errors import DebugError, TLaunchError
from tlaunch.server.auth import User
from tlaunch.server.deps import NO_TOKEN, ApiError, Auth, user_of
from tlaunch.server.routes import Owner, own_entry
from tlaunch.server.views import JobIndex

__all__ = ["SESSIONS_PER_USER", "debug_router"]

log = logging.getLogger(__name__)

SESSIONS_PER_USER = 4
"""Debugger sessions one user may hold open through the server at once."""
_THREADS = anyio.CapacityLimiter(64)  # two a session: its connect and its reader
_MAX_WAIT = 600.0  # s a session may wait for its node to pause
_CLOSE_NORMAL, _CLOSE_REFUSED, _CLOSE_BUSY = 1000, 4403, 4429

FindRun = Callable[[str, str | None], RunHandle | None]


def _paused_dict(p: control_debug.PausedNode) -> dict[str, Any]:
    d = p.pause
    return {"node": p.node, "host": p.host, "at": d.at, "kind": d.kind, "since": d.since,
            "attached": d.attached, "exception": d.exception, "rank": d.rank}  # fmt: skip


def debug_router(index: JobIndex, find: FindRun) -> APIRouter:
    """The debugger's routes over the server's jobs (``find``: a run by its id and owner)."""
    router = APIRouter()
    sessions: Counter[str] = Counter()
    held = threading.Lock()

    def run_of(name: str, user: User, owner: str | None) -> RunHandle:
        entry = own_entry(index, name, user, owner)
        if entry.ended:
            raise ApiError(409, f"job {name!r} has ended ({entry.state}): no node of it waits in a debugger")
        handle = find(str(entry.row.run_id), entry.row.owner) if entry.row.run_id else None
        if handle is None:
            raise ApiError(409, f"job {name!r} has not started yet ({entry.state}): nothing to debug")
        return handle

    @router.get("/v1/jobs/{name}/paused")
    def paused(name: str, user: Auth, owner: Owner = None) -> dict[str, Any]:
        """The nodes of the job's run that wait in a debugger now (``breakpoint()``, a post-mortem)."""
        handle = run_of(name, user, owner)
        try:
            found = control_debug.paused(handle)
        except (DebugError, TLaunchError) as exc:
            raise ApiError(502, str(exc)) from None
        return {"job": name, "run_id": handle.run_id, "paused": [_paused_dict(p) for p in found]}

    @router.websocket("/v1/jobs/{name}/debug")
    async def debug_session(
        ws: WebSocket, name: str, node: str, wait: float = 0.0, owner: str | None = None
    ) -> None:
        """Node ``node``'s pdb: a text frame ``{"greeting"}`` (or ``{"error", "status"}``, then the
        close), then pdb's bytes both ways until either side closes."""
        user = user_of(ws)
        await ws.accept()
        if user is None:
            await _refuse(ws, 401, NO_TOKEN)
            return
        with held:
            busy = sessions[user.name] >= SESSIONS_PER_USER
            if not busy:
                sessions[user.name] += 1
        if busy:
            busy_message = f"{user.name} holds {SESSIONS_PER_USER} debugger sessions already: end one"
            await _refuse(ws, 429, busy_message)
            return
        try:
            await _session(ws, user, name, node, min(max(wait, 0.0), _MAX_WAIT), owner, run_of)
        finally:
            with held:
                sessions[user.name] -= 1

    return router


async def _session(
    ws: WebSocket,
    user: User,
    name: str,
    node: str,
    wait: float,
    owner: str | None,
    run_of: Callable[[str, User, str | None], RunHandle],
) -> None:
    try:
        handle = await run_sync(run_of, name, user, owner, limiter=_THREADS)
        session = await run_sync(
            lambda: control_debug.connect(handle, node, wait=wait), limiter=_THREADS, abandon_on_cancel=True
        )
    except ApiError as exc:
        await _refuse(ws, exc.status, exc.message)
        return
    except KeyError as exc:
        await _refuse(ws, 404, str(exc.args[0]))
        return
    except (DebugError, TLaunchError) as exc:
        await _refuse(ws, 409, str(exc))
        return
    log.info("debugger: %s attached to %s of job %s (run %s)", user.name, node, name, handle.run_id)
    try:
        await ws.send_text(json.dumps({"greeting": session.greeting}))
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_node_to_client, ws, session.sock, tasks.cancel_scope)
            await _client_to_node(ws, session.sock)
            tasks.cancel_scope.cancel()
    finally:
        session.close()  # the node goes on
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await ws.close(_CLOSE_NORMAL)
        log.info("debugger: %s left %s of job %s", user.name, node, name)


async def _node_to_client(ws: WebSocket, sock: ssl.SSLSocket, scope: anyio.CancelScope) -> None:
    """pdb's output to the client until the node ends the session (then the whole session ends)."""
    while True:
        try:
            data = await run_sync(sock.recv, 65536, limiter=_THREADS, abandon_on_cancel=True)
        except OSError:
            data = b""
        if not data:
            scope.cancel()
            return
        try:
            await ws.send_bytes(data)
        except (RuntimeError, WebSocketDisconnect):
            scope.cancel()
            return


async def _client_to_node(ws: WebSocket, sock: ssl.SSLSocket) -> None:
    """The client's lines to pdb until the client leaves."""
    while True:
        try:
            message = await ws.receive()
        except (RuntimeError, WebSocketDisconnect):
            return
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("bytes") or (message.get("text") or "").encode()
        try:
            sock.sendall(data)  # a line a person typed: never long enough to wait on
        except OSError:
            return


async def _refuse(ws: WebSocket, status: int, message: str) -> None:
    code = _CLOSE_BUSY if status == 429 else _CLOSE_REFUSED
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await ws.send_text(json.dumps({"error": message, "status": status}))
        await ws.close(code)
