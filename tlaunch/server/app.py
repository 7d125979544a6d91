"""The job server's REST API (``/v1``): packages, jobs, their logs; one JSON error shape everywhere.

Every error answers ``{"error": {"status": 404, "code": "not_found", "message":
"..."}}``, never a traceback. See ``docs/server.md`` for the endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import tlaunch
from tlaunch import control
from tlaunch.control import RunNotFoundError
from tlaunch.control.starting.envs import envs_root
from tlaunch.errors import TLaunchError
from tlaunch.runtime.envgc import KEEP_BYTES, KEEP_DAYS, collect
from tlaunch.runtime.pyenv import MARKER
from tlaunch.server import resources
from tlaunch.server.auth import Users
from tlaunch.server.dashboard import make_router
from tlaunch.server.debugging import debug_router
from tlaunch.server.deps import ApiError, Auth
from tlaunch.server.envstore import EnvStore
from tlaunch.server.errors import answer_errors
from tlaunch.server.guard import Guard
from tlaunch.server.launches import Launches
from tlaunch.server.models import CODES, ErrorBody
from tlaunch.server.observe import Metrics, Observe
from tlaunch.server.packages import SHARED, BadPackage, Packages
from tlaunch.server.poolapi import pool_router
from tlaunch.server.routes import JobRoutes, job_router
from tlaunch.server.scheduling import Scheduling
from tlaunch.server.starter import Starter
from tlaunch.server.store import JobRow, JobStore
from tlaunch.server.streams import Streams
from tlaunch.server.unixusers import UnixUsers
from tlaunch.server.views import JobIndex
from tlaunch.server.watcher import Watcher

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
        max_streams_per_user: streams (logs followed, a run's events) one user may hold open (429 above).
        max_starting: jobs launched at the same time (the others wait their turn, ``PENDING``).
        env_keep_bytes, env_keep_days: runtime environments of the server's run stores (``envs``;
            under ``--unix-users`` each user's: :mod:`tlaunch.server.envstore`) unused for longer, or
            past that size, the least recently used first, are removed (:mod:`tlaunch.runtime.envgc`;
            looked at every ten minutes). No environment larger than ``env_keep_bytes`` is sealed.
        pool: the file of its pool of SSH hosts (``pool.yaml``: :mod:`tlaunch.server.pool`).
    """

    home: str
    users: Users
    max_package_bytes: int = 512 << 20
    db: str | None = None
    job_env: tuple[str, ...] = ()
    max_request_bytes: int = 1 << 20
    server_names: tuple[str, ...] = ()
    unix: UnixUsers | None = None
    max_streams_per_user: int = 64
    max_starting: int = 4
    env_keep_bytes: int = KEEP_BYTES
    env_keep_days: float = KEEP_DAYS
    pool: str | None = None


def create_app(settings: Settings) -> FastAPI:
    """The server's ASGI application (its watcher and starter run while the application does)."""
    os.makedirs(os.path.join(settings.home, "server"), mode=0o700, exist_ok=True)
    store = JobStore(settings.db or os.path.join(settings.home, "server", "jobs.db"))
    packages = Packages(
        os.path.join(settings.home, "server", "packages"), max_bytes=settings.max_package_bytes
    )
    index = JobIndex()
    starter = Starter(settings.home, settings.job_env, settings.unix)

    def find(run_id: str, owner: str | None) -> control.RunHandle | None:
        """A run of the server's jobs: in its owner's run store, or in whichever has it."""
        home = starter.home_of(owner) if owner is not None else None
        try:
            if home is None:
                return starter.find_run(run_id)
            return starter.adopt(home, control.attach(*control.find_record(run_id, home)))
        except (RunNotFoundError, TLaunchError):
            return None

    watcher = Watcher(settings.home, store, index, find)
    metrics = Metrics(jobs=lambda: dict(Counter(e.state for e in index.entries())))
    metrics.registry.register(
        resources.JobResources(settings.home, store, lambda row: _state(index, row), starter.find_run)
    )
    streams = Streams(settings.max_streams_per_user, metrics)
    launches = Launches(settings.home, store, packages, index, watcher, starter, settings.max_starting)
    sched = Scheduling(settings.pool, settings.home, store, launches, watcher)
    keep = (settings.env_keep_bytes, settings.env_keep_days)
    envstore = EnvStore(settings.unix, max_bytes=settings.env_keep_bytes) if settings.unix else None

    def collect_envs() -> list[str]:
        """Remove the runtime environments nobody used for long, or past the size bound (the removed)."""
        if envstore is not None:
            return envstore.collect(*keep)
        return list(collect(envs_root(settings.home), MARKER, *keep).removed)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(watcher.load)  # every job, the running ones asked once
        watcher.start()
        await run_in_threadpool(sched.open)  # the pool: what holds what again, its queue, a first probe
        if envstore is not None:
            await run_in_threadpool(envstore.start)  # before any job of a user asks it
        launches.recover()  # the jobs a server before this one accepted and had not launched
        tokens = asyncio.create_task(_follow_tokens(settings.users))
        envs = asyncio.create_task(_collect_envs(collect_envs))
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGHUP, lambda: settings.users.reload(force=True)
            )
        try:
            yield
        finally:
            tokens.cancel()
            envs.cancel()
            sched.close()
            launches.close()
            watcher.stop()
            streams.close()
            if envstore is not None:
                envstore.close()

    app = FastAPI(
        title="tlaunch job server", version=tlaunch.__version__, responses=_ERRORS, lifespan=lifespan
    )
    app.state.settings = settings
    app.state.store = store
    app.state.index = index
    app.state.watcher = watcher
    app.state.streams = streams
    app.state.metrics = metrics  # the streams count themselves in it (open streams by route)
    app.add_middleware(
        Guard,
        max_body=settings.max_request_bytes,
        upload_path="/v1/package",
        max_upload=settings.max_package_bytes,
        hosts=settings.server_names,
        same_origin=not settings.users.required,
    )
    app.add_middleware(Observe, metrics=metrics)  # outermost: it sees the guard's refusals too
    answer_errors(app)

    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus(user: Auth) -> Response:
        if not user.admin:
            raise ApiError(403, "only an admin reads the server's metrics")
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/version")
    async def version(user: Auth) -> dict[str, str]:
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

    app.include_router(
        job_router(JobRoutes(settings.home, store, packages, index, watcher, launches, streams, sched))
    )
    app.include_router(pool_router(sched.pool, index))
    app.include_router(make_router(settings.home, store, watcher, streams, starter.homes, starter.adopt))
    app.include_router(resources.make_router(settings.home, store, starter.find_run))
    app.include_router(debug_router(index, find))
    return app


def _state(index: JobIndex, row: JobRow) -> str:
    """A job's state now, as the server's view has it."""
    entry = index.get(row.owner, row.name)
    return entry.state if entry is not None else (row.final_state or "PENDING")


async def _collect_envs(collect_envs: Callable[[], list[str]], every: float = 600.0) -> None:
    """Remove the runtime environments nobody used for long (or past the size bound), now and then."""
    while True:
        try:
            for path in await run_in_threadpool(collect_envs):
                log.warning("removed the unused runtime environment %s", path)
        except Exception:  # the next look tries again
            log.exception("removing unused runtime environments")
        await asyncio.sleep(every)


async def _follow_tokens(users: Users, every: float = 0.5) -> None:
    """Read the token file again whenever it changes (a stat twice a second)."""
    while True:
        await asyncio.sleep(every)
        try:
            users.reload()
        except Exception:  # the next look tries again
            log.exception("reading the tokens again")
