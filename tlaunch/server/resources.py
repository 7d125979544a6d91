"""What the server shows of its jobs' resource use: the dashboard's charts and Prometheus' gauges.

* ``GET /v1/runs/<id>/metrics?since=``: each node's samples (CPU, memory, threads,
  files, GPU; one a second, the last five minutes: :mod:`tlaunch.control.metrics`)
  as JSON, for the run's charts. The same bearer tokens and visibility as
  ``/v1/runs``: a user sees the runs of their own jobs, an admin every run.
* ``POST /v1/runs/<id>/stop`` (its owner, or an admin: the dashboard's stop button) and
  ``GET /v1/runs/<id>/nodes/<node>/log`` (a node's whole log, as a file to download).
* :class:`JobResources`, a collector of the server's ``/metrics`` registry
  (:mod:`tlaunch.server.observe`), read at each scrape:
  ``tlaunch_server_jobs_by_user{user, state}``, ``tlaunch_server_queue_length``
  (jobs accepted and not started), and per node of each running job
  ``tlaunch_job_cpu_percent``, ``tlaunch_job_memory_bytes``,
  ``tlaunch_job_gpu_percent``, ``tlaunch_job_gpu_memory_bytes`` (labels ``job``,
  ``user``, ``node``, ``host``). ``docs/grafana-dashboard.json`` draws them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tlaunch import control
from tlaunch.control import RunHandle, RunNotFoundError
from tlaunch.errors import TLaunchError
from tlaunch.server.auth import User
from tlaunch.server.deps import ApiError, Auth
from tlaunch.server.store import JobRow, JobStore

__all__ = ["JobResources", "make_router"]

_FRESH = 5.0  # s: a node's sample older than this is not its use now (it ended, or its host is lost)
_PENDING = "PENDING"


class JobResources(Collector):
    """The jobs by user and state, the queue's length and each running job's nodes' use, at a scrape.

    Args:
        home: the server's run store.
        store: its jobs.
        state_of: a job's state now (its row's final state, or its run's).
        find_run: a run of the server's jobs by its id (default: in ``home``'s run store; under
            ``--unix-users``, each user's).
    """

    def __init__(
        self,
        home: str,
        store: JobStore,
        state_of: Callable[[JobRow], str],
        find_run: Callable[[str], RunHandle] | None = None,
    ) -> None:
        self._home, self._store, self._state_of = home, store, state_of
        self._find_run = find_run or (lambda run_id: control.attach(*control.find_record(run_id, home)))

    def collect(self) -> Iterable[GaugeMetricFamily]:
        by_user = GaugeMetricFamily(
            "tlaunch_server_jobs_by_user", "the server's jobs, by owner and state", labels=["user", "state"]
        )
        counts: dict[tuple[str, str], int] = {}
        for row in self._store.list(limit=1 << 30):
            key = (row.owner, self._state_of(row))
            counts[key] = counts.get(key, 0) + 1
        for (user, state), n in sorted(counts.items()):
            by_user.add_metric([user, state], n)
        queue = GaugeMetricFamily("tlaunch_server_queue_length", "jobs accepted and not started yet")
        queue.add_metric([], sum(n for (_, state), n in counts.items() if state == _PENDING))
        yield by_user
        yield queue
        yield from self._use()

    def _use(self) -> Iterable[GaugeMetricFamily]:
        labels = ["job", "user", "node", "host"]
        families = {
            "cpu": GaugeMetricFamily("tlaunch_job_cpu_percent", "a node's CPU, % of one core", labels=labels),
            "rss": GaugeMetricFamily("tlaunch_job_memory_bytes", "a node's resident memory", labels=labels),
            "gpu": GaugeMetricFamily("tlaunch_job_gpu_percent", "a node's GPU use, %", labels=labels),
            "gpu_mem": GaugeMetricFamily(
                "tlaunch_job_gpu_memory_bytes", "a node's GPU memory", labels=labels
            ),
        }
        now = time.time()
        for row in self._store.live():
            try:
                handle = self._find_run(str(row.run_id))
            except TLaunchError:
                continue
            snap_hosts = {n.key: n.host for n in handle.snapshot().nodes}
            for node, samples in control.metrics.samples(handle, now - _FRESH).items():
                last = samples[-1]
                values = [row.name, row.owner, node, snap_hosts.get(node, "")]
                for field, family in families.items():
                    value = getattr(last, field)
                    if value is not None:
                        family.add_metric(values, float(value))
        yield from families.values()


def make_router(home: str, store: JobStore, find_run: Callable[[str], RunHandle] | None = None) -> APIRouter:
    """The route of a run's samples, over the run store of ``home`` and the server's jobs (``find_run``:
    a run by its id, as :class:`JobResources` takes it)."""
    router = APIRouter()
    find = find_run or (lambda run_id: control.attach(*control.find_record(run_id, home)))

    def handle_of(run_id: str, user: User) -> RunHandle:
        if not user.admin and run_id not in store.run_ids(user.name):
            raise ApiError(404, f"no run {run_id!r} of yours")
        try:
            return find(run_id)
        except (RunNotFoundError, TLaunchError) as exc:
            raise ApiError(404, str(exc)) from None

    @router.post("/v1/runs/{run_id}/stop")
    def stop(run_id: str, user: Auth) -> dict[str, Any]:
        """Stop the run on every host (its owner's job's, or any run for an admin); its state after."""
        handle = handle_of(run_id, user)
        try:
            handle.stop()
        except TLaunchError as exc:
            raise ApiError(409, f"run {run_id} could not be stopped: {exc}") from None
        return {"run_id": run_id, "state": handle.snapshot().state.value}

    @router.get(  # its errors are JSON, the one shape: only its 200 is text
        "/v1/runs/{run_id}/nodes/{node:path}/log",
        responses={
            200: {"description": "the log", "content": {"text/plain": {"schema": {"type": "string"}}}}
        },
    )
    def node_log(run_id: str, node: str, user: Auth) -> PlainTextResponse:
        """Node ``node``'s whole log so far, as a file to download."""
        handle = handle_of(run_id, user)
        try:
            text = "".join(f"{line.text}\n" for line in handle.logs(node))
        except KeyError as exc:
            raise ApiError(404, str(exc.args[0])) from None
        except TLaunchError as exc:
            raise ApiError(404, str(exc)) from None
        name = f"{run_id}-{node.replace('/', '_')}.log"
        return PlainTextResponse(text, headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @router.get("/v1/runs/{run_id}/metrics")
    def metrics(run_id: str, user: Auth, since: float = Query(0.0, ge=0.0)) -> dict[str, Any]:
        """Each node's samples taken after ``since`` (seconds since the epoch), oldest first."""
        handle = handle_of(run_id, user)
        samples = control.metrics.samples(handle, since)
        return {"run_id": run_id, "nodes": {k: [s.to_dict() for s in v] for k, v in samples.items()}}

    return router
