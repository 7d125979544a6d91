"""The job routes of the REST API: submit, list, status, stop, delete, logs.

Status and lists answer from the server's view of its jobs
(:mod:`tlaunch.server.views`) on the event loop: no thread, no database query,
no call to a run per request; each job's JSON is made once per change. A
submit is checked and written, answered ``201`` with the job ``PENDING``,
and launched after (:mod:`tlaunch.server.launches`). Logs stream without a
thread (:mod:`tlaunch.server.streams`). Job names are per user: a user names
their own jobs; an admin names another's with ``?owner=``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from tlaunch.control import LogLine, LogSteps, RunHandle
from tlaunch.errors import TLaunchError
from tlaunch.runtime.methods import COMMAND, SCRIPT, get_method
from tlaunch.runtime.pyenv import has_requirements
from tlaunch.server.auth import User
from tlaunch.server.deps import ApiError, Auth
from tlaunch.server.jobs import ended_without_run, job_of, log_lines, view_job
from tlaunch.server.launches import Launches
from tlaunch.server.models import SubmitJob, check_submission
from tlaunch.server.packages import Package, Packages
from tlaunch.server.scheduling import Scheduling
from tlaunch.server.store import DuplicateJob, JobRow, JobStore
from tlaunch.server.streams import Streams, event, follower_of, log_event, log_events
from tlaunch.server.views import Entry, JobIndex, dumps
from tlaunch.server.watcher import Watcher

__all__ = ["STATES", "JobRoutes", "job_router", "own_entry", "stop_quietly"]

log = logging.getLogger(__name__)
STATES = ("PENDING", "RUNNING", "RESTARTING", "STOPPING", "SUCCEEDED", "FAILED", "STOPPED", "LOST")
_JSON = "application/json"
_JOB_DOC: dict[int | str, dict[str, Any]] = {200: {"content": {_JSON: {"schema": {"type": "object"}}}}}
_SSE_DOC: dict[int | str, dict[str, Any]] = {
    200: {"description": "server-sent events", "content": {"text/event-stream": {}}}
}
Owner = Annotated[str | None, Query(description="the job's owner: an admin naming another user's job")]


@dataclass(frozen=True)
class JobRoutes:
    """What the job routes work with."""

    home: str
    store: JobStore
    packages: Packages
    index: JobIndex
    watcher: Watcher
    launches: Launches
    streams: Streams
    sched: Scheduling


def stop_quietly(handle: RunHandle) -> None:
    """Stop a run; a failure to is logged (what was left is in the run's record)."""
    try:
        handle.stop()
    except TLaunchError as exc:
        log.warning("stopping run %s: %s", handle.run_id, exc)


def own_entry(index: JobIndex, name: str, user: User, owner: str | None) -> Entry:
    """The job ``user`` names: their own ``name``; an admin's ``owner``'s (any user's, when only one
    has that name). Another user's job is not found, as a job that does not exist.

    Raises:
        ApiError: 404, no such job of theirs; 409, an admin named a job several users have.
    """
    entry = None
    if owner is not None and user.may_see(owner):
        entry = index.get(owner, name)
    elif owner is None:
        entry = index.get(user.name, name)
        if entry is None and user.admin:
            named = index.named(name)
            if len(named) > 1:
                owners = ", ".join(sorted(e.row.owner for e in named))
                raise ApiError(
                    409, f"{owners} each have a job {name!r}: give owner= (e.g. {named[0].row.owner})"
                )
            entry = named[0] if named else None
    if entry is None:
        raise ApiError(404, f"no job {name!r}")
    return entry


def job_router(r: JobRoutes) -> APIRouter:
    """The job routes over ``r``."""
    router = APIRouter()

    def own_job(name: str, user: User, owner: str | None) -> Entry:
        return own_entry(r.index, name, user, owner)

    @router.post("/v1/trainer/job", status_code=201, responses={201: _JOB_DOC[200]})
    async def submit(body: SubmitJob, user: Auth) -> Response:
        found = r.packages.find(user.name, body.trainer_package)
        if found is None:
            raise ApiError(404, f"no package {body.trainer_package!r}; upload it first (POST /v1/package)")
        package = found[1]
        if _light(r, body, package):  # a script or a command on hosts: checked here, at once
            row = _checked(r, body, user, package)
        else:  # a program's source parsed, requirements hashed, a batch script made...: in a thread
            row = await run_in_threadpool(_checked, r, body, user, package)
        try:  # recorded before the answer: a server killed now launches it when it starts
            await asyncio.wrap_future(r.store.add_soon(row))
        except DuplicateJob:
            raise ApiError(
                409, f"you have a job named {body.job_name!r}; pick another name or delete it"
            ) from None
        entry = Entry.of(view_job(row))  # PENDING: accepted
        r.index.put(entry)
        r.sched.accept(row)  # queued in the pool, or launched
        return Response(_body(r, entry), 201, {"Location": f"/v1/jobs/{row.name}"}, _JSON)

    @router.get("/v1/jobs", responses=_JOB_DOC)
    async def list_jobs(
        user: Auth,
        state: str | None = None,
        label: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI's form for repeated parameters
        owner: str | None = None,
        limit: int = Query(50, ge=1, le=500),
        offset: int = Query(0, ge=0),
    ) -> Response:
        bad = [item for item in label if "=" not in item or not item.partition("=")[0]]
        if bad:
            raise ApiError(400, f"label {bad[0]!r} is not KEY=VALUE (e.g. label=team=rl)")
        wanted = dict(item.partition("=")[::2] for item in label)
        if state is not None and state.upper() not in STATES:
            raise ApiError(400, f"state {state!r} is not one of {list(STATES)}")
        if owner is not None and not user.may_see(owner):
            raise ApiError(403, f"only an admin lists the jobs of {owner!r}")
        who = owner if owner is not None else (None if user.admin else user.name)
        page, total = r.index.page(
            owner=who, labels=wanted, state=state and state.upper(), limit=limit, offset=offset
        )
        body = b'{"jobs":[' + b",".join(_body(r, e) for e in page) + b'],"total":%d}' % total
        return Response(body, media_type=_JSON)

    @router.get("/v1/jobs/{name}", responses=_JOB_DOC)
    async def get_job(name: str, user: Auth, owner: Owner = None) -> Response:
        return Response(_body(r, own_job(name, user, owner)), media_type=_JSON)

    @router.post("/v1/jobs/{name}/stop", status_code=202, responses={200: {"description": "it had ended"}})
    def stop_job(name: str, response: Response, user: Auth, owner: Owner = None) -> dict[str, Any]:
        entry = own_job(name, user, owner)
        if entry.ended:
            response.status_code = 200
            return _dict(entry)
        run_id = entry.row.run_id
        if not run_id:  # not launched yet: now it never will be (its launch, if under way, is stopped)
            if _stop_before_launch(r, entry.row):
                r.sched.ended(entry.row)  # out of the pool's queue, or what it held freed
                response.status_code = 200
                return _dict(r.index.get(entry.row.owner, name) or entry)
            now = r.store.get(entry.row.owner, name)  # its launch returned meanwhile
            run_id = now.run_id if now is not None else None
        handle = r.watcher.handle(run_id)
        if handle is None:
            response.status_code = 200
            return _dict(entry)
        threading.Thread(target=stop_quietly, args=(handle,), name=f"stop {name}", daemon=True).start()
        out = _dict(entry)
        out["state"] = "STOPPING"
        return out

    @router.post("/v1/jobs/{name}/restart", status_code=201, responses={201: _JOB_DOC[200]})
    def restart_job(name: str, user: Auth, owner: Owner = None) -> Response:
        """A new run of a job that has ended, from the same spec and package (its owner or an admin):
        answered ``PENDING`` at once, as a submit is, and launched after."""
        entry = own_job(name, user, owner)
        row = entry.row
        if not entry.ended:
            raise ApiError(409, f"job {name!r} is {entry.state}; stop it first, then restart it")
        found = r.packages.find(row.owner, str(row.spec.get("trainer_package")))
        if found is None:
            raise ApiError(
                409,
                f"job {name!r}'s package {row.spec.get('trainer_package')!r} is gone: upload it and "
                "submit again",
            )
        r.store.update(row.owner, row.name, run_id=None, final_state=None, final=None, message=None,
                       started=None, planned_run=None, scheduling=r.sched.again(row))  # fmt: skip
        fresh = r.store.get(row.owner, row.name)
        assert fresh is not None
        entry = Entry.of(view_job(fresh))  # PENDING: accepted again
        r.index.put(entry)
        r.sched.restart(fresh, row.run_id or row.planned_run)  # a pool's job is placed again
        return Response(_body(r, entry), 201, {"Location": f"/v1/jobs/{row.name}"}, _JSON)

    @router.delete("/v1/jobs/{name}")
    def delete_job(name: str, user: Auth, force: bool = False, owner: Owner = None) -> dict[str, Any]:
        entry = own_job(name, user, owner)
        running = not entry.ended and bool(entry.row.run_id or entry.row.started)
        if running and not force:
            raise ApiError(409, f"job {name!r} is {entry.state}; stop it first, or delete with ?force=true")
        handle = r.watcher.handle(entry.row.run_id) if running else None
        if handle is not None:
            stop_quietly(handle)
        r.store.delete(entry.row.owner, name)  # a launch under way finds it gone, and stops what it started
        r.index.remove(entry.row.owner, name)
        r.sched.ended(entry.row)  # out of the pool's queue, or its hosts freed as its processes go
        return {"deleted": name, "owner": entry.row.owner}

    @router.get("/v1/jobs/{name}/logs", responses=_SSE_DOC)
    async def job_logs(
        request: Request,
        name: str,
        user: Auth,
        node: str | None = None,
        tail: int | None = Query(None, ge=1),
        follow: bool = False,
        owner: Owner = None,
    ) -> Response:
        entry = own_job(name, user, owner)
        who = entry.row.owner
        if not entry.row.run_id and (entry.ended or not follow):
            raise ApiError(404, f"job {name!r} has no run to read logs from ({entry.state})")

        def ended() -> bool:
            now = r.index.get(who, name)
            return now is None or now.ended

        def state() -> str:
            now = r.index.get(who, name)
            return now.state if now is not None else "deleted"

        if not follow:
            handle = r.watcher.handle(entry.row.run_id)
            if handle is None:
                raise ApiError(404, f"job {name!r} has no run to read logs from ({entry.state})")
            try:
                lines = await run_in_threadpool(lambda: list(log_lines(handle, node, False, tail)))
            except KeyError as exc:
                raise ApiError(404, str(exc.args[0])) from None

            async def whole() -> Any:
                for line in lines:
                    yield log_event(line)
                yield event({"state": state()}, "end")

            return r.streams.respond(request, user, whole())
        first = await _follower(r, entry.row.run_id, node) if entry.row.run_id else None

        async def followed() -> Any:
            source = first
            if source is None:  # not launched yet: wait for its run (or its end)
                while source is None:
                    now = r.index.get(who, name)
                    if now is None or (now.ended and not now.row.run_id):
                        yield event({"state": state()}, "end")
                        return
                    if now.row.run_id:
                        try:
                            source = await _follower(r, now.row.run_id, node)
                        except ApiError as exc:
                            yield event({"status": exc.status, "message": exc.message}, "error")
                            return
                    else:
                        yield None
                        await asyncio.sleep(r.streams.poll)
            async for item in log_events(r.streams, source, ended):
                yield item
            if not ended():  # its backend's own follower saw the end before the watcher's next round
                await r.streams.in_pool(_refresh, r, who, name)
            yield event({"state": state()}, "end")

        return r.streams.respond(request, user, followed())

    return router


async def _follower(r: JobRoutes, run_id: str | None, node: str | None) -> LogSteps | Iterator[LogLine]:
    """How run ``run_id``'s logs are followed (:func:`~tlaunch.server.streams.follower_of`).

    Raises:
        ApiError: 404, no such run or node.
    """
    handle = r.watcher.handle(run_id)
    if handle is None:
        raise ApiError(404, f"run {run_id!r} is not in the server's run store")
    try:
        source: LogSteps | Iterator[LogLine] = await r.streams.in_pool(follower_of, handle, node)
    except KeyError as exc:
        raise ApiError(404, str(exc.args[0])) from None
    except TLaunchError as exc:
        raise ApiError(404, f"cannot follow the logs of run {run_id}: {exc}") from None
    return source


def _refresh(r: JobRoutes, owner: str, name: str) -> None:
    """Ask ``owner``'s job ``name``'s run how it is now (its view, in the index)."""
    entry = r.index.get(owner, name)
    if entry is not None and entry.row.final is None and entry.row.run_id:
        r.watcher.refresh(entry.row)


def _light(r: JobRoutes, body: SubmitJob, package: Package) -> bool:
    """Whether checking a submit reads nothing of its package but a few files' existence: a script
    or a command on hosts, without requirements, on a server without a pool. Others (a program's
    source is parsed, a requirements file and what it names hashed, a batch script or an LPJob
    made, the pool asked) are checked in a thread, off the event loop."""
    return (
        get_method(body.launch_method).entry in (SCRIPT, COMMAND)
        and body.slurm is None
        and body.kubernetes is None
        and body.pip is None
        and body.requirements is None
        and r.sched.pool is None
        and not has_requirements(package.path)
    )


def _checked(r: JobRoutes, body: SubmitJob, user: User, package: Package) -> JobRow:
    """The row of a job ``user`` submits of ``package``, every value of it checked (nothing
    written or started).

    Raises:
        ApiError: what the job cannot be (400).
    """
    check_submission(body, package.path)
    row = JobRow(body.job_name, user.name, body.model_dump(), dict(body.labels))
    try:
        job, _ = job_of(row, package)  # every value checked before the name is taken
    except TLaunchError as exc:
        raise ApiError(400, str(exc)) from None
    r.sched.admit(body, user.admin, row, job.num_trainer)  # a job the pool could never place: 400
    return row


def _dict(entry: Entry) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(entry.body)
    return out


def _body(r: JobRoutes, entry: Entry) -> bytes:
    """A job's JSON, with its place in the pool's queue when it waits there (that changes without its row)."""
    queue = r.sched.queue_of(entry.row)
    return entry.body if queue is None else entry.body[:-1] + b',"queue":' + dumps(queue) + b"}"


def _stop_before_launch(r: JobRoutes, row: JobRow) -> bool:
    """Stop a job not launched yet; whether it was stopped so (False: its launch returned meanwhile)."""
    now = r.store.get(row.owner, row.name)
    if now is None or now.run_id or now.final is not None:
        return False
    view = ended_without_run(replace(now), "STOPPED", "stopped before it started")
    r.store.update(row.owner, row.name, final_state="STOPPED", message=view.message, final=view.row.final)
    r.index.replace(Entry.of(view))
    return True
