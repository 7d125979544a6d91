"""What the server says about itself: an access log line per request, and Prometheus metrics.

:class:`Observe` is a pure ASGI middleware: when a request's answer ends it
logs one line (``tlaunch.server.access``, INFO) and counts it::

    GET /v1/jobs/train user=alice status=200 ms=3.1

(method, path without its query, the user of its token or ``-``, status,
milliseconds; never a header, so never a token). :class:`Metrics` holds the
server's own registry, served at ``GET /metrics`` in Prometheus' text format
(``prometheus_client``):

- ``tlaunch_server_requests_total{method, route, status}``: requests answered;
- ``tlaunch_server_request_seconds{method, route}``: time to the answer's
  first byte (a histogram; a stream's first byte is its headers);
- ``tlaunch_server_open_streams{route}``: streams (server-sent events) open
  now: a streaming route holds :meth:`Metrics.stream` while it streams;
- ``tlaunch_server_jobs{state}``: the server's jobs by state, read when scraped.

``route`` is the route's template (``/v1/jobs/{name}``), so one job's name
never becomes a label of its own; a path no route serves is ``unmatched``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tlaunch.server.guard import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ACCESS", "Metrics", "Observe"]

ACCESS = logging.getLogger("tlaunch.server.access")
"""The access log (one INFO line per request)."""
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Jobs(Collector):
    """The jobs by state, counted when Prometheus scrapes."""

    def __init__(self, count: Callable[[], dict[str, int]]) -> None:
        self._count = count

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("tlaunch_server_jobs", "the server's jobs, by state", labels=["state"])
        for state, n in sorted(self._count().items()):
            family.add_metric([state], n)
        yield family


class Metrics:
    """The server's metrics, in a registry of its own (several servers may share a process).

    Args:
        jobs: the jobs by state (called at each scrape).
    """

    def __init__(self, jobs: Callable[[], dict[str, int]] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tlaunch_server_requests",
            "requests answered",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tlaunch_server_request_seconds",
            "seconds to an answer's first byte",
            ["method", "route"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "tlaunch_server_open_streams", "streams open now", ["route"], registry=self.registry
        )
        if jobs is not None:
            self.registry.register(_Jobs(jobs))

    @contextlib.contextmanager
    def stream(self, route: str) -> Iterator[None]:
        """Count a stream of ``route`` as open while the block runs."""
        gauge = self.open_streams.labels(route)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()


def route_of(scope: Scope) -> str:
    """The template of the route that served ``scope`` (``unmatched``: none)."""
    route = scope.get("route")
    return str(getattr(route, "path", None) or "unmatched")


class Observe:
    """The middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what a route that raised before answering is taken to have answered
        started = False

        async def observed(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = int(message["status"]), True
                route = route_of(scope)
                self.metrics.latency.labels(scope["method"], route).observe(time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            route = route_of(scope)
            if not started:
                self.metrics.latency.labels(scope["method"], route).observe(time.perf_counter() - start)
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
            state: Any = scope.get("state") or {}
            user = state.get("user", "-") if isinstance(state, dict) else "-"
            ms = (time.perf_counter() - start) * 1000
            path = repr(scope["path"])[1:-1]  # a newline in a path cannot forge a line of the log
            ACCESS.info("%s %s user=%s status=%d ms=%.1f", scope["method"], path, user, status, ms)
