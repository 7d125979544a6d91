"""The job server's REST API (``/v1``): packages, jobs, their logs; one JSON error shape everywhere.

Every error answers ``{"error": {"status": 404, "code": "not_found", "message":
"..."}}``, never a traceback. See ``docs/server.md`` for the endpoints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import tlaunch
from tlaunch.errors import TLaunchError
from tlaunch.server import resources
from tlaunch.server.auth import User, Users
from tlaunch.server.dashboard import make_router
from tlaunch.server.deps import ApiError, Auth
from tlaunch.server.errors import answer_errors
from tlaunch.server.guard import Guard
from tlaunch.server.jobs import Jobs, JobView, job_of, log_lines
from tlaunch.server.models import CODES, ErrorBody, SubmitJob, check_submission
from tlaunch.server.observe import Metrics, Observe
from tlaunch.server.packages import SHARED, BadPackage, ChangedPackage, Packages
from tlaunch.server.starter import Starter
from tlaunch.server.store import DuplicateJob, JobRow, JobStore
from tlaunch.server.unixusers import UnixUsers

__all__ = ["ApiError", "Settings", "create_app"]

log = logging.getLogger(__name__)
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": code} for status, code in CODES.items()
}


@dataclass(frozen=True)
class Settings:
    """How the server runs.

    Attributes:
        home: its ``TLAUNCH_HOME``: the run store of its jobs, its database and packages.
        users: the tokens it accepts (none: every request is an admin's; loopback only).
        max_package_bytes: the largest upload (413 above).
        db: the jobs' database: ``postgresql://...``, or SQLite (default ``<home>/server/jobs.db``).
        job_env: names (patterns) of the server's environment its jobs get too
            (:func:`tlaunch.control.starting.jobenv.job_environ`: a job never inherits the rest).
        max_request_bytes: the largest body of a JSON request (413 above, before it is read).
        server_names: the ``Host`` names it answers to (empty: any; see :mod:`tlaunch.server.guard`).
        unix: ``--unix-users``: each user's jobs run as their own account (None: as the server's).
    """

    home: str
    users: Users
    max_package_bytes: int = 512 << 20
    db: str | None = None
    job_env: tuple[str, ...] = ()
    max_request_bytes: int = 1 << 20
    server_names: tuple[str, ...] = ()
    unix: UnixUsers | None = None


Owner = Annotated[str | None, Query(description="the job's owner: an admin naming another user's job")]
_STATES = ("PENDING", "RUNNING", "RESTARTING", "STOPPING", "SUCCEEDED", "FAILED", "STOPPED", "LOST")


def create_app(settings: Settings) -> FastAPI:
    """The server's ASGI application (its job watcher runs while the application does)."""
    os.makedirs(os.path.join(settings.home, "server"), mode=0o700, exist_ok=True)
    store = JobStore(settings.db or os.path.join(settings.home, "server", "jobs.db"))
    starter = Starter(settings.home, settings.job_env, settings.unix)
    jobs = Jobs(settings.home, store, home_of=starter.home_of)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        jobs.start()
        try:
            yield
        finally:
            jobs.stop()

    app = FastAPI(
        title="tlaunch job server", version=tlaunch.__version__, responses=_ERRORS, lifespan=lifespan
    )
    app.state.settings = settings
    app.state.jobs = jobs
    metrics = Metrics(jobs=lambda: job_counts(store, jobs))
    metrics.registry.register(
        resources.JobResources(
            settings.home, store, lambda row: row.final_state or jobs.view(row).state, starter.find_run
        )
    )
    app.state.metrics = metrics  # streaming routes hold metrics.stream(route) while they stream
    app.add_middleware(
        Guard,
        max_body=settings.max_request_bytes,
        upload_path="/v1/package",
        max_upload=settings.max_package_bytes,
        hosts=settings.server_names,
        same_origin=not settings.users,
    )
    app.add_middleware(Observe, metrics=metrics)  # outermost: it sees the guard's refusals too
    packages = Packages(
        os.path.join(settings.home, "server", "packages"), max_bytes=settings.max_package_bytes
    )
    answer_errors(app)

    def own_job(name: str, user: User, owner: str | None) -> JobRow:
        """The job ``user`` names: their own ``name``; an admin's ``owner``'s (any user's, when only one
        has that name). Another user's job is not found, as a job that does not exist."""
        if owner is not None and user.may_see(owner):
            row = store.get(owner, name)
        elif owner is None:
            row = store.get(user.name, name)
            if row is None and user.admin:
                named = store.named(name)
                if len(named) > 1:
                    owners = ", ".join(sorted(r.owner for r in named))
                    raise ApiError(
                        409, f"{owners} each have a job {name!r}: give owner= (e.g. {named[0].owner})"
                    )
                row = named[0] if named else None
        else:
            row = None
        if row is None:
            raise ApiError(404, f"no job {name!r}")
        return row

    @app.get("/v1/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    def prometheus(user: Auth) -> Response:
        if not user.admin:
            raise ApiError(403, "only an admin reads the server's metrics")
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/version")
    def version(user: Auth) -> dict[str, str]:
        return {"version": tlaunch.__version__, "api": "v1"}

    @app.post(
        "/v1/package",
        status_code=201,
        responses={200: {"description": "already stored: the same package"}},
        openapi_extra={
            "requestBody": {
                "required": True,
                "description": "a zip or tar (optionally compressed) of the package's folder",
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            }
        },
    )
    async def upload(
        request: Request, response: Response, user: Auth, shared: bool = False
    ) -> dict[str, Any]:
        said = request.headers.get("content-length", "")
        if said.isdigit() and int(said) > settings.max_package_bytes:
            raise ApiError(413, f"the package is {said} bytes; the limit is {settings.max_package_bytes}")
        with packages.of(
            SHARED if shared else user.name
        ).receive() as incoming:  # to a file as it arrives, never whole in memory
            try:
                async for chunk in request.stream():
                    incoming.write(chunk)
            except BadPackage as exc:
                raise ApiError(413, str(exc)) from None
            try:  # unpacking takes a while: not on the event loop, which serves every other request
                package, new = await run_in_threadpool(incoming.store)
            except BadPackage as exc:
                raise ApiError(400, f"refused package: {exc}") from None
        response.status_code = 201 if new else 200
        return {"package_id": package.package_id, "sha256": package.sha256, "size": package.size, "new": new,
                "shared": shared}  # fmt: skip

    @app.get("/v1/packages/{package_id}")
    def get_package(package_id: str, user: Auth) -> dict[str, Any]:
        found = packages.find(user.name, package_id)
        if found is None:
            raise ApiError(404, f"no package {package_id!r}")
        store, package = found
        return {"package_id": package.package_id, "sha256": package.sha256, "size": package.size,
                "shared": store.root.endswith(SHARED)}  # fmt: skip

    @app.post("/v1/trainer/job", status_code=201)
    def submit(body: SubmitJob, response: Response, user: Auth) -> dict[str, Any]:
        found = packages.find(user.name, body.trainer_package)
        if found is None:
            raise ApiError(404, f"no package {body.trainer_package!r}; upload it first (POST /v1/package)")
        package_store, package = found
        check_submission(body, package.path)
        row = JobRow(body.job_name, user.name, body.model_dump(), dict(body.labels))
        try:
            job_of(row, package)  # a dry run: every value checked before the name is taken
        except TLaunchError as exc:
            raise ApiError(400, str(exc)) from None
        try:
            store.add(row)
        except DuplicateJob:
            raise ApiError(
                409, f"you have a job named {body.job_name!r}; pick another name or delete it"
            ) from None
        return start_run(row, package_store, package, response)

    def start_run(row: JobRow, package_store: Any, package: Any, response: Response) -> dict[str, Any]:
        """Start a run of ``row``'s job (its run id in its row); a refusal ends the job FAILED."""
        try:
            handle = starter.start(row, package_store, package)
        except (TLaunchError, ChangedPackage) as exc:
            final: dict[str, Any] = {"state": "FAILED", "message": str(exc), "exit_code": None,
                                     "refs": {"run_id": None}, "nodes": [], "failure": None}  # fmt: skip
            store.update(row.owner, row.name, final_state="FAILED", message=str(exc), final=final)
            status = 409 if isinstance(exc, ChangedPackage) else 400
            raise ApiError(status, f"job {row.name!r} could not start: {exc}") from None
        store.update(row.owner, row.name, run_id=handle.run_id)
        row.run_id = handle.run_id
        response.headers["Location"] = f"/v1/jobs/{row.name}"
        return jobs.view(row).to_dict()

    @app.get("/v1/jobs")
    def list_jobs(
        user: Auth,
        state: str | None = None,
        label: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI's form for repeated parameters
        owner: str | None = None,
        limit: int = Query(50, ge=1, le=500),
        offset: int = Query(0, ge=0),
    ) -> dict[str, Any]:
        bad = [item for item in label if "=" not in item or not item.partition("=")[0]]
        if bad:
            raise ApiError(400, f"label {bad[0]!r} is not KEY=VALUE (e.g. label=team=rl)")
        wanted = dict(item.partition("=")[::2] for item in label)
        if state is not None and state.upper() not in _STATES:
            raise ApiError(400, f"state {state!r} is not one of {list(_STATES)}")
        if owner is not None and not user.may_see(owner):
            raise ApiError(403, f"only an admin lists the jobs of {owner!r}")
        who = owner if owner is not None else (None if user.admin else user.name)
        rows = store.list(owner=who, labels=wanted, limit=1 << 30)
        if state is None:  # only the page's jobs are read from their runs
            page = [jobs.view(r).to_dict() for r in rows[offset : offset + limit]]
            return {"jobs": page, "total": len(rows)}
        wanted_state = state.upper()
        matched: list[tuple[JobRow, JobView | None]] = []
        for r in rows:  # a job that has ended says so in its row: only running ones are asked
            if r.final is not None:
                if r.final_state == wanted_state:
                    matched.append((r, None))
                continue
            view = jobs.view(r)
            if view.state == wanted_state:
                matched.append((r, view))
        page = [(v or jobs.view(r)).to_dict() for r, v in matched[offset : offset + limit]]
        return {"jobs": page, "total": len(matched)}

    @app.get("/v1/jobs/{name}")
    def get_job(name: str, user: Auth, owner: Owner = None) -> dict[str, Any]:
        return jobs.view(own_job(name, user, owner)).to_dict()

    @app.post("/v1/jobs/{name}/stop", status_code=202, responses={200: {"description": "it had ended"}})
    def stop_job(name: str, response: Response, user: Auth, owner: Owner = None) -> dict[str, Any]:
        row = own_job(name, user, owner)
        view = jobs.view(row)
        handle = None if view.snapshot is None else starter.handle(row)
        if handle is None or view.snapshot is None or view.snapshot.state.ended:
            response.status_code = 200
            return view.to_dict()
        threading.Thread(target=_stop_quietly, args=(handle,), name=f"stop {name}", daemon=True).start()
        out = view.to_dict()
        out["state"] = "STOPPING"
        return out

    @app.post("/v1/jobs/{name}/restart", status_code=201)
    def restart_job(name: str, response: Response, user: Auth, owner: Owner = None) -> dict[str, Any]:
        """A new run of a job that has ended, from the same spec and package (its owner or an admin)."""
        row = own_job(name, user, owner)
        view = jobs.view(row)
        if row.final is None and (view.snapshot is None or not view.snapshot.state.ended):
            raise ApiError(409, f"job {name!r} is {view.state}; stop it first, then restart it")
        spec = SubmitJob.model_validate(row.spec)
        found = packages.find(row.owner, spec.trainer_package)
        if found is None:
            raise ApiError(
                409, f"job {name!r}'s package {spec.trainer_package!r} is gone: upload it and submit again"
            )
        store.update(row.owner, row.name, run_id=None, final_state=None, final=None, message=None)
        fresh = store.get(row.owner, row.name)
        assert fresh is not None
        return start_run(fresh, *found, response)

    @app.delete("/v1/jobs/{name}")
    def delete_job(name: str, user: Auth, force: bool = False, owner: Owner = None) -> dict[str, Any]:
        row = own_job(name, user, owner)
        view = jobs.view(row)
        running = view.snapshot is not None and not view.snapshot.state.ended
        if running and not force:
            raise ApiError(409, f"job {name!r} is {view.state}; stop it first, or delete with ?force=true")
        handle = starter.handle(row)
        if running and handle is not None:
            _stop_quietly(handle)
        store.delete(row.owner, name)
        return {"deleted": name, "owner": row.owner}

    @app.get(
        "/v1/jobs/{name}/logs",
        response_class=StreamingResponse,
        responses={200: {"description": "server-sent events", "content": {"text/event-stream": {}}}},
    )
    def job_logs(
        name: str,
        user: Auth,
        node: str | None = None,
        tail: int | None = Query(None, ge=1),
        follow: bool = False,
        owner: Owner = None,
    ) -> StreamingResponse:
        row = own_job(name, user, owner)
        handle = starter.handle(row)
        if handle is None:
            raise ApiError(404, f"job {name!r} has no run to read logs from ({jobs.view(row).state})")
        try:
            lines = log_lines(handle, node, follow, tail)
            first = next(lines, None)
        except KeyError as exc:
            raise ApiError(404, str(exc.args[0])) from None

        def events() -> Iterator[str]:
            with metrics.stream("/v1/jobs/{name}/logs"):
                if first is not None:
                    yield _event(first)
                for line in lines:
                    yield _event(line)
                yield f"event: end\ndata: {json.dumps({'state': jobs.view(row).state})}\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    app.include_router(make_router(settings.home, store, starter.homes, starter.adopt))
    app.include_router(resources.make_router(settings.home, store, starter.find_run))
    app.state.store = store
    return app


def job_counts(store: JobStore, jobs: Jobs) -> dict[str, int]:
    """The server's jobs by state (an ended job's from its row; a running one's from its run)."""
    counts: dict[str, int] = {}
    for row in store.list(limit=1 << 30):
        state = row.final_state or jobs.view(row).state
        counts[state] = counts.get(state, 0) + 1
    return counts


def _event(line: Any) -> str:
    data = {"node": line.node, "host": line.host, "text": line.text, "where": line.where}
    return f"data: {json.dumps(data)}\n\n"


def _stop_quietly(handle: Any) -> None:
    try:
        handle.stop()
    except TLaunchError as exc:  # what was left is in the run's record; the job's state says the rest
        log.warning("stopping run %s: %s", handle.run_id, exc)
