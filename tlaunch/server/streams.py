"""The server's streams (server-sent events): asynchronous, limited per user, gone when their client is.

A stream (``GET /v1/jobs/<name>/logs?follow=true``, ``/v1/runs/<id>/events``,
``/v1/runs/<id>/logs``) is a coroutine of the event loop that waits with
``asyncio.sleep`` between its looks, never a thread that sleeps, so a thousand
open streams leave every other request its answer:

- **logs** are read step by step (:class:`~tlaunch.control.LogSteps`: the
  files of this machine, a SLURM job's output, the tails an SSH run's hosts
  send) four times a second while lines come (and for 1.5 s after the last,
  or after the stream began), down to once a second while none do
  (:class:`Backoff`); a step that may wait (listing a run's new logs,
  which asks its coordinator) goes to the streams' own small thread pool, not
  the one requests use. A run whose backend cannot be stepped (a Kubernetes
  job, an SSH run being prepared) is followed by a thread of its own, which
  ends with the stream (at its next line, or the run's end).
- **events** of a run come from the server's watcher (:mod:`tlaunch.server.watcher`),
  which asks each watched run how it is once per round, however many streams watch it.
- **its end**: a job's stream ends when the server's view says the job has
  ended; a run's, when the watcher's last snapshot says it has.

Every stream counts against its user's limit (``max_per_user``, past which a
new one is ``429``); it is released the moment the client leaves (the server
cancels the stream's coroutine as the connection closes) or the stream ends.
Between its events a stream checks its token again whenever the server's
tokens changed, and ends with an ``error`` event (401) once it is revoked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from tlaunch.control import LogFollowing, LogLine, LogSteps, RunHandle
from tlaunch.server.auth import User
from tlaunch.server.deps import ApiError, still_valid
from tlaunch.server.observe import Metrics

__all__ = ["Backoff", "Streams", "bridged", "event", "follower_of", "log_event", "log_events", "stepped"]

HEARTBEAT = 15.0
"""Seconds of quiet after which a stream sends a comment line (proxies and clients see it alive)."""
PATIENCE = 1.5
"""Seconds a log stream keeps looking ``poll`` apart after it began or after its last line: the
first line of a job just submitted is seen within ``poll`` of its writing."""
Item = str | None
"""What a stream's source yields: an event's text, or None (a tick: nothing to send yet)."""


def event(data: Any, name: str | None = None) -> str:
    """A server-sent event of ``data`` (JSON), named ``name`` (None: a plain ``data:`` message)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def log_event(line: LogLine) -> str:
    """The event of one log line."""
    return event({"node": line.node, "host": line.host, "text": line.text, "where": line.where})


class _Stream(StreamingResponse):
    """A streaming answer that gives its place back however it ends (even if never started)."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


class Streams:
    """The server's open streams: their count per user, their limit, their thread pool.

    Args:
        max_per_user: streams one user may hold open at once.
        metrics: the server's metrics, whose open-streams gauge (by route) counts them.
        poll: seconds between a log stream's reads while lines come.
    """

    def __init__(self, max_per_user: int = 64, metrics: Metrics | None = None, poll: float = 0.25) -> None:
        self.max_per_user = max_per_user
        self.metrics = metrics
        self.poll = poll
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.executor = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="stream step")

    @property
    def open(self) -> int:
        """Streams open now, every user's."""
        return sum(self._open.values())

    def open_of(self, user: str) -> int:
        """Streams ``user`` holds open now."""
        return self._open[user]

    def respond(
        self,
        request: Request,
        user: User,
        source: AsyncIterator[Item],
        cleanup: Callable[[], None] | None = None,
    ) -> StreamingResponse:
        """The answer that streams ``source`` to ``request``'s client, counted against ``user``.

        Raises:
            ApiError: 429, ``user`` holds ``max_per_user`` streams open already.
        """
        with self._lock:
            if self._open[user.name] >= self.max_per_user:
                if cleanup is not None:
                    cleanup()
                raise ApiError(
                    429,
                    f"{user.name} has {self._open[user.name]} streams open, the most one user may "
                    f"(--max-streams-per-user {self.max_per_user}); close some (each dashboard tab holds "
                    "two, each `tlaunch job logs -f` one)",
                )
            self._open[user.name] += 1
        released = threading.Event()
        route = str(getattr(request.scope.get("route"), "path", None) or "unmatched")
        gauge = self.metrics.open_streams.labels(route) if self.metrics is not None else None
        if gauge is not None:
            gauge.inc()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                self._open[user.name] -= 1
                if self._open[user.name] <= 0:
                    del self._open[user.name]
            if gauge is not None:
                gauge.dec()
            if cleanup is not None:
                cleanup()

        return _Stream(self._guarded(request, user, source), release)

    async def _guarded(self, request: Request, user: User, source: AsyncIterator[Item]) -> AsyncIterator[str]:
        """``source``'s events; ended by a revoked token; a comment after a quiet spell."""
        quiet_since = time.monotonic()
        try:
            async for item in source:
                if not still_valid(request, user):
                    yield event({"status": 401, "code": "unauthorized", "message": "the token was revoked"},
                                "error")  # fmt: skip
                    return
                if item is not None:
                    quiet_since = time.monotonic()
                    yield item
                elif time.monotonic() - quiet_since > HEARTBEAT:
                    quiet_since = time.monotonic()
                    yield ": still here\n\n"
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    async def in_pool(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` on the streams' own threads (a step that may wait)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, func, *args)

    def close(self) -> None:
        """Stop the streams' threads."""
        self.executor.shutdown(wait=False, cancel_futures=True)


class Backoff:
    """A stream's wait between looks: ``first`` after news and for ``patience`` seconds after it
    (or after the stream began: a job just submitted prints its first line within a second or
    so), then doubling while nothing comes, up to ``most``; each a little longer or shorter at
    random, so streams opened together look at different moments (a thousand of them never wake
    in one burst)."""

    def __init__(self, first: float, most: float = 1.0, patience: float = 0.0) -> None:
        self.first, self.most = first, max(first, most)
        self.patience = patience
        self.now = first
        self._news = time.monotonic()

    async def sleep(self, news: bool) -> None:
        """Wait before the next look (``news``: the last look found something)."""
        if news:
            self._news = time.monotonic()
        patient = time.monotonic() - self._news < self.patience
        self.now = self.first if news or patient else min(self.most, self.now * 2)
        await asyncio.sleep(self.now * random.uniform(0.8, 1.2))


async def stepped(
    streams: Streams, follower: LogSteps, ended: Callable[[], bool]
) -> AsyncIterator[LogLine | None]:
    """The lines of ``follower`` until ``ended()`` (asked before each read); None between reads."""
    wait = Backoff(streams.poll, patience=PATIENCE)
    try:
        while True:
            last = ended()
            if last or follower.relist_due():  # these may wait: not on the event loop
                lines = await streams.in_pool(follower.read, last)
            else:
                lines = follower.read()
            for line in lines:
                yield line
            if last:
                return
            yield None
            await wait.sleep(bool(lines))
    finally:
        follower.close()  # never waits (LogSteps.close)


_DONE = object()


async def bridged(lines: Iterator[LogLine], tick: float = 0.5) -> AsyncIterator[LogLine | None]:
    """The lines of a blocking iterator, read by a thread of its own; None every ``tick`` s of quiet.

    The thread stops at the iterator's next line once the stream is gone (it cannot be
    interrupted while the iterator waits: only backends that cannot be stepped come here).
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    gone = threading.Event()

    def put(item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads any longer
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def pump() -> None:
        try:
            for line in lines:
                if gone.is_set():
                    break
                put(line)
        except Exception as exc:  # said to the client by the stream (an error event)
            put(exc)
        finally:
            with contextlib.suppress(Exception):
                getattr(lines, "close", lambda: None)()
            put(_DONE)

    threading.Thread(target=pump, name="follow logs", daemon=True).start()
    try:
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), tick)
            except asyncio.TimeoutError:
                yield None
                continue
            if item is _DONE:
                return
            if isinstance(item, Exception):
                raise item
            assert isinstance(item, LogLine)
            yield item
    finally:
        gone.set()


def follower_of(handle: RunHandle, node: str | None) -> LogSteps | Iterator[LogLine]:
    """How ``handle``'s logs (node ``node``'s only) are followed: step by step when its backend
    can (:class:`~tlaunch.control.LogSteps`), else its blocking iterator (to :func:`bridged`).
    It may wait (an SSH run's connections): call it on a thread.

    Raises:
        KeyError: the run has no log of node ``node``.
        TLaunchError: its logs cannot be reached.
    """
    if isinstance(handle, LogFollowing):
        follower = handle.log_follower(node)
        if follower is not None:
            return follower
    return handle.logs(node, follow=True)


async def log_events(
    streams: Streams, source: LogSteps | Iterator[LogLine], ended: Callable[[], bool]
) -> AsyncIterator[Item]:
    """The events of ``source``'s lines (:func:`follower_of`) until ``ended()``; ticks between them."""
    lines = stepped(streams, source, ended) if isinstance(source, LogSteps) else bridged(source)
    async for line in lines:
        yield None if line is None else log_event(line)
