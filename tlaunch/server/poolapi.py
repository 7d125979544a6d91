"""The pool's routes: ``GET /v1/pool``, ``POST /v1/pool/probe``, ``POST /v1/jobs/<name>/priority``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from tlaunch.server.deps import ApiError, Auth
from tlaunch.server.pool import ServerPool, pooled
from tlaunch.server.views import JobIndex

__all__ = ["Priority", "pool_router"]


class Priority(BaseModel):
    """``POST /v1/jobs/<name>/priority``: a waiting job's new priority (higher goes first)."""

    priority: int = Field(ge=-1000, le=1000)


def pool_router(pool: ServerPool | None, index: JobIndex) -> APIRouter:
    """The routes of the server's pool (without one: 404 that says how to have one)."""
    router = APIRouter()

    def need() -> ServerPool:
        if pool is None:
            raise ApiError(404, "this server has no pool of hosts; start it with --pool pool.yaml")
        return pool

    @router.get("/v1/pool")
    def get_pool(user: Auth) -> dict[str, Any]:
        """Every host: up or down, its GPUs (the job on each, others' processes), CPUs, memory; the queue."""
        return need().view(user.may_see)

    @router.post("/v1/pool/probe")
    async def probe(user: Auth) -> dict[str, Any]:
        """Probe every host now (an admin's); the pool as it is after."""
        if not user.admin:
            raise ApiError(
                403, "only an admin probes the pool on demand (it probes itself every probe_every s)"
            )
        it = need()
        changed = await run_in_threadpool(it.service.probe)
        return {"changed": changed, **it.view(user.may_see)}

    @router.post("/v1/jobs/{name}/priority")
    def set_priority(
        name: str,
        body: Priority,
        user: Auth,
        owner: Annotated[str | None, Query(description="the job's owner (another user's job)")] = None,
    ) -> dict[str, Any]:
        """Set a job's priority in the pool's queue (an admin's)."""
        it = need()
        if not user.admin:
            raise ApiError(403, "only an admin sets a job's priority")
        entry = index.get(owner or user.name, name)
        named = index.named(name) if entry is None and owner is None else []
        if entry is None and len(named) == 1:
            entry = named[0]
        if entry is None:
            raise ApiError(
                404, f"no job {name!r}" + (" (several users have one: give owner=)" if named else "")
            )
        row = entry.row
        if not pooled(row):
            raise ApiError(409, f"job {name!r} is not the pool's (it names its own place)")
        it.set_priority(row, body.priority)
        return {"name": name, "owner": row.owner, "priority": body.priority, "queue": it.queue_of(row)}

    return router
