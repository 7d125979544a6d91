"""The live dashboard: a page of our own (plain JavaScript, server-sent events) and the API it reads.

``/dashboard/`` lists the server's jobs and every run of its run store (also
runs started with ``launch()`` or ``tlaunch torchrun`` under the same
``TLAUNCH_HOME``); a run's view draws its graph of nodes (groups, hosts, who
holds whose handle), with node states, restarts and the root-cause failure
changing live, and each node's log lines as they come.

API (the same bearer tokens as ``/v1/jobs``; a user sees the runs of their
own jobs, an admin every run): ``GET /v1/runs``, ``GET /v1/runs/<id>``
(snapshot and graph), ``GET /v1/runs/<id>/events`` (a ``snapshot`` event each
time it changes, until the run ends) and ``GET /v1/runs/<id>/logs?node=&follow=``.
"""

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from importlib import resources
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from tlaunch import control
from tlaunch.control import LogLine, RunHandle, RunNotFoundError, RunSnapshot
from tlaunch.errors import TLaunchError
from tlaunch.runtime.records import RunRecord, list_records
from tlaunch.server.auth import User
from tlaunch.server.deps import ApiError, Auth
from tlaunch.server.store import JobStore
from tlaunch.server.streams import Backoff, Streams, follower_of, log_event, log_events
from tlaunch.server.watcher import Watcher

__all__ = ["make_router"]

_STATIC = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}
_POLL = 0.25  # the watcher looks twice a second: a change is seen within 0.25 s of it
_SSE = {"Cache-Control": "no-cache"}
_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {"description": "server-sent events", "content": {"text/event-stream": {}}}
}


def _static(name: str) -> str:
    return resources.files("tlaunch.server").joinpath("static").joinpath(name).read_text(encoding="utf-8")


def make_router(
    home: str,
    store: JobStore,
    watcher: Watcher,
    streams: Streams,
    homes: Callable[[], Sequence[str]] | None = None,
    adopt: Callable[[str, RunHandle], RunHandle] | None = None,
) -> APIRouter:
    """The dashboard's routes, over the run store of ``home`` and the server's jobs (``homes``: every
    run store the server's jobs use, ``--unix-users``: each user's own; default ``[home]``; ``adopt``:
    a handle of a store's run as the server reads it, default as it is). A run's state comes from the
    server's ``watcher`` when it follows the run; its streams are the server's ``streams``."""
    router = APIRouter()
    stores = homes or (lambda: [home])

    def find_record(run_id: str) -> tuple[str, RunRecord]:
        """The folder and record of run ``run_id``, in whichever store has it."""
        for where in stores():
            with contextlib.suppress(RunNotFoundError):
                return control.find_record(run_id, where)
        raise RunNotFoundError(f"no run {run_id!r}")

    def attach(run_dir: str, record: RunRecord) -> RunHandle:
        handle = control.attach(run_dir, record)
        where = os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))  # <store>/runs/<run id>
        return adopt(where, handle) if adopt is not None else handle

    def visible(user: User) -> set[str] | None:
        """The run ids ``user`` may see (None: every run)."""
        if user.admin:
            return None
        return store.run_ids(user.name)

    def run_of(run_id: str, user: User) -> tuple[RunHandle, list[dict[str, Any]]]:
        """The run's handle and its graph (read once: a run's graph does not change)."""
        allowed = visible(user)
        if allowed is not None and run_id not in allowed:
            raise ApiError(404, f"no run {run_id!r}")
        try:
            run_dir, record = find_record(run_id)
            return attach(run_dir, record), record.graph
        except (RunNotFoundError, TLaunchError) as exc:
            raise ApiError(404, str(exc)) from None

    def snapshot(handle: RunHandle) -> RunSnapshot:
        """The run now: the watcher's last look when it follows it, else asked."""
        seen = watcher.seen(handle.run_id)
        return seen[0] if seen is not None else handle.snapshot()

    def detail(handle: RunHandle, graph: list[dict[str, Any]]) -> dict[str, Any]:
        return {**snapshot(handle).to_dict(), "graph": graph}

    def graph_of(run_id: str) -> list[dict[str, Any]]:
        with contextlib.suppress(RunNotFoundError, TLaunchError):
            return find_record(run_id)[1].graph
        return []

    @router.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/dashboard/")

    @router.get("/dashboard/", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(_static("index.html"))

    @router.get("/dashboard/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        if name not in _STATIC:
            raise ApiError(404, f"no file {name!r} in the dashboard")
        return Response(_static(name), media_type=_STATIC[name])

    @router.get("/v1/runs")
    def runs(
        user: Auth, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0)
    ) -> dict[str, Any]:
        allowed = visible(user)
        page: list[RunHandle] = []
        if allowed is None:  # every run of every store
            found = [item for where in stores() for item in list_records(control.runs_dir(where))]
        else:  # only the user's own runs are read (each from its folder), not the whole store
            found = []
            for run_id in allowed:
                with contextlib.suppress(RunNotFoundError, TLaunchError):
                    found.append(find_record(run_id))
        found.sort(key=lambda item: item[1].created, reverse=True)
        total = len(found)
        for run_dir, record in found[offset : offset + limit]:
            with contextlib.suppress(TLaunchError):
                page.append(attach(run_dir, record))
        out: list[dict[str, Any]] = []
        for handle in page:  # only the page's runs are asked how they are (those the watcher follows, not)
            snap = snapshot(handle)
            out.append(
                {
                    "run_id": snap.run_id,
                    "program": snap.program,
                    "backend": snap.backend,
                    "state": snap.state.value,
                    "hosts": list(snap.hosts),
                    "nodes": len(snap.nodes),
                    "created": snap.created,
                    "failed_node": snap.failure.node if snap.failure else None,
                }
            )
        return {"runs": out, "total": total}

    @router.get("/v1/runs/{run_id}")
    def run(run_id: str, user: Auth) -> dict[str, Any]:
        return detail(*run_of(run_id, user))

    @router.get("/v1/runs/{run_id}/events", response_class=StreamingResponse, responses=_SSE_DOC)
    async def events(request: Request, run_id: str, user: Auth) -> StreamingResponse:
        handle, graph = await run_in_threadpool(run_of, run_id, user)
        return streams.respond(request, user, _events(watcher, streams, handle, graph, graph_of))

    @router.get("/v1/runs/{run_id}/logs", response_class=StreamingResponse, responses=_SSE_DOC)
    async def logs(
        request: Request,
        run_id: str,
        user: Auth,
        node: str | None = None,
        follow: bool = False,
        tail: int | None = Query(None, ge=1),
    ) -> StreamingResponse:
        handle, _ = await run_in_threadpool(run_of, run_id, user)
        if not follow:
            try:
                lines = await run_in_threadpool(lambda: _tail(handle.logs(node), tail))
            except (KeyError, TLaunchError) as exc:
                raise ApiError(404, str(exc.args[0] if isinstance(exc, KeyError) else exc)) from None

            async def whole() -> AsyncIterator[str | None]:
                for line in lines:
                    yield log_event(line)
                yield "event: end\ndata: {}\n\n"

            return streams.respond(request, user, whole())
        try:
            source = await streams.in_pool(lambda: follower_of(handle, node))
        except (KeyError, TLaunchError) as exc:
            raise ApiError(404, str(exc.args[0] if isinstance(exc, KeyError) else exc)) from None
        watcher.watch(handle.run_id, handle)  # its end, as the watcher sees it, ends the stream

        def ended() -> bool:
            seen = watcher.seen(handle.run_id)
            return seen is not None and seen[0].ended

        async def followed() -> AsyncIterator[str | None]:
            async for item in log_events(streams, source, ended):
                yield item
            yield "event: end\ndata: {}\n\n"

        return streams.respond(request, user, followed(), lambda: watcher.unwatch(handle.run_id))

    return router


async def _events(
    watcher: Watcher,
    streams: Streams,
    handle: RunHandle,
    graph: list[dict[str, Any]],
    graph_of: Callable[[str], list[dict[str, Any]]],
) -> AsyncIterator[str | None]:
    """A ``snapshot`` event at once, then each time the watcher sees the run change; ``end`` once it
    has ended."""
    run_id = handle.run_id
    watcher.watch(run_id, handle)
    wait = Backoff(_POLL)
    try:
        last, version, known = None, 0, graph
        first: tuple[RunSnapshot, int] | None = None
        if watcher.seen(run_id) is None:  # nobody watches it yet: asked now, not at the next round
            first = (await streams.in_pool(handle.snapshot), -1)
        while True:
            seen, first = first or watcher.seen(run_id), None
            news = seen is not None and seen[1] != version
            if seen is not None and seen[1] != version:
                snap, version = seen
                if not known:  # recorded before it started (its environment being built): not yet
                    known = await streams.in_pool(graph_of, run_id)
                text = json.dumps({**snap.to_dict(), "graph": known}, sort_keys=True)
                if text != last:
                    yield f"event: snapshot\ndata: {text}\n\n"
                    last = text
                if snap.ended:
                    yield "event: end\ndata: {}\n\n"
                    return
            yield None
            await wait.sleep(news)
    finally:
        watcher.unwatch(run_id)


def _tail(lines: Iterator[LogLine], tail: int | None) -> list[LogLine]:
    kept = list(lines)
    return kept[-tail:] if tail else kept
