"""What the dashboard draws of a run's resource use: ``GET /v1/runs/<id>/metrics?since=``.

Each node's samples (CPU, memory, threads, files, GPU; one a second, the last five
minutes: :mod:`tlaunch.control.metrics`) as JSON, for the run's charts. The same
bearer tokens and visibility as ``/v1/runs``: a user sees the runs of their own
jobs, an admin every run.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from tlaunch import control
from tlaunch.control import RunNotFoundError
from tlaunch.errors import TLaunchError
from tlaunch.server.deps import ApiError, Auth
from tlaunch.server.store import JobStore

__all__ = ["make_router"]


def make_router(home: str, store: JobStore) -> APIRouter:
    """The route of a run's samples, over the run store of ``home`` and the server's jobs."""
    router = APIRouter()

    @router.get("/v1/runs/{run_id}/metrics")
    def metrics(run_id: str, user: Auth, since: float = Query(0.0, ge=0.0)) -> dict[str, Any]:
        """Each node's samples taken after ``since`` (seconds since the epoch), oldest first."""
        if not user.admin and run_id not in store.run_ids(user.name):
            raise ApiError(404, f"no run {run_id!r} of yours")
        try:
            handle = control.attach(*control.find_record(run_id, home))
        except (RunNotFoundError, TLaunchError) as exc:
            raise ApiError(404, str(exc)) from None
        samples = control.metrics.samples(handle, since)
        return {"run_id": run_id, "nodes": {k: [s.to_dict() for s in v] for k, v in samples.items()}}

    return router
