"""A node's pause in the debugger: its listener, its reports to the coordinator, its pdb.

The parts of :mod:`tlaunch.runtime.debugger` that a node loads only when it pauses
(pdb and its imports: ~8 ms of a node's start otherwise).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import sys
import threading
import time
from types import FrameType, TracebackType
from typing import Any

from tlaunch import context
from tlaunch.errors import RPCError
from tlaunch.rpc.client import RPCClient, fixed_resolver
from tlaunch.runtime.debugger import (
    ANNOUNCEMENT,
    BREAKPOINT,
    POST_MORTEM,
    POST_MORTEM_WAIT,
    SERVER_JOB,
    TICKET,
)
from tlaunch.runtime.debugger.channel import Listener
from tlaunch.runtime.debugger.pause import Pause
from tlaunch.runtime.debugger.remote import RemotePdb, TerminalWire
from tlaunch.runtime.node_runtime import NodeRuntime

__all__ = ["in_node", "post_mortem", "set_trace"]

log = logging.getLogger(__name__)

_one_at_a_time: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def _timeout(kind: str) -> float | None:
    """Seconds a pause of ``kind`` waits for a debugger (None: as long as the run goes on)."""
    given = os.environ.get("TLAUNCH_DEBUG_TIMEOUT")
    if given:
        with contextlib.suppress(ValueError):
            return float(given) if float(given) > 0 else None
        log.warning("TLAUNCH_DEBUG_TIMEOUT=%r is not a number of seconds: ignored", given)
    return POST_MORTEM_WAIT if kind == POST_MORTEM else None


class _Session:
    """One pause of one node thread: its listener, its reports, its pdb."""

    def __init__(self, node: NodeRuntime, kind: str, exception: str | None = None) -> None:
        assert node.key is not None
        self.node, self.key, self.kind, self.exception = node, node.key, kind, exception
        self.terminal = _terminal(node)
        self.pdb = RemotePdb(self._wait, self._left, TerminalWire() if self.terminal else None)
        self.pause: Pause | None = None
        self.came = self.waited = 0.0
        self.outcome = "no debugger attached"
        self._held: threading.Lock | _TicketLock | None = None

    def _tell(self, method: str, *args: Any) -> None:
        try:
            getattr(self.node.coordinator, method)(self.key, *args)
        except (RPCError, OSError) as exc:  # a run that has stopped needs no word (its end is told)
            warn = log.debug if self.node.stop_event().is_set() else log.warning
            warn("could not tell the coordinator that %s %s: %s", self.key, method, exc)

    def _wait(self, frame: FrameType, line: int) -> bool:
        """Listen, say where the node is paused, and wait for a debugger (see the module docstring)."""
        self._held = _lock(self.key)
        self._held.acquire()  # the node's other threads pause after this one's session
        try:
            came = self._wait_held(frame, line)
        except BaseException:
            self._release()
            raise
        if not came:
            self._release()
        return came

    def _release(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()

    def _wait_held(self, frame: FrameType, line: int) -> bool:
        config = self.node.config
        if self.terminal:  # threads: this process's terminal is the node's pdb
            path = frame.f_code.co_filename
            at = f"{os.path.basename(path)}:{line}"
            where = (at, path, line, frame.f_code.co_name, self.kind, "this terminal", time.time())
            self.pause = Pause(*where, attached=True, pid=os.getpid(), exception=self.exception)
            self._tell("paused", self.pause.to_dict())
            self.came = time.monotonic()
            print(f"tlaunch: {self.key} paused ({self.kind} at {at}): this terminal is its pdb", flush=True)
            return True
        listener = Listener(config.keys, config.bind_host, config.advertise_host)
        path = frame.f_code.co_filename
        at = f"{os.path.basename(path)}:{line}"
        self.pause = Pause(
            at, path, line, frame.f_code.co_name, self.kind, listener.address, time.time(),
            pid=os.getpid(), exception=self.exception, rank=os.environ.get("RANK") if _child else None,
        )  # fmt: skip
        self._tell("paused", self.pause.to_dict())
        command = f"tlaunch debug {config.run_id} {self.key}"
        what = f"{self.kind} at {at}" + (f", rank {self.pause.rank}" if self.pause.rank is not None else "")
        what += f": {self.exception}" if self.exception else ""
        print(f"{ANNOUNCEMENT}{command} ({what})", file=sys.stdout, flush=True)
        server_job = os.environ.get(SERVER_JOB)
        if server_job:  # its run's key is the job server's: its users attach through it
            print(f"tlaunch: through the job server: tlaunch job debug {server_job} {self.key}", flush=True)
        started = time.monotonic()
        limit = _timeout(self.kind)
        try:
            sock = listener.accept(self.node.stop_event(), None if limit is None else started + limit)
        finally:
            listener.close()
            self.waited += time.monotonic() - started
        if sock is None:
            stopped = self.node.stop_event().is_set()
            why = "the run stopped" if stopped else f"no debugger came within {limit:.0f} s"
            print(f"tlaunch: {self.key} goes on: {why}", file=sys.stdout, flush=True)
            self._tell("resumed", self._note(why))
            return False
        self.pdb.wire.attach(sock)
        self.came = time.monotonic()
        self.pause = dataclasses.replace(self.pause, attached=True)
        self._tell("paused", self.pause.to_dict())
        host = config.host_name
        self.pdb.wire.write(
            f"tlaunch: attached to {self.key} on {host} (pid {os.getpid()}), {self.kind} at {at}\n"
        )
        return True

    def _left(self, why: str) -> None:
        spent = time.monotonic() - self.came
        self.outcome = f"a debugger was attached for {spent:.0f} s ({why})"
        print(f"tlaunch: the debugger of {self.key} left ({why}); it goes on", file=sys.stdout, flush=True)
        self._tell("resumed", self._note(self.outcome))
        self._release()

    def _note(self, what: str) -> str | None:
        return f"held for a post-mortem: {what}" if self.kind == POST_MORTEM else None


def _node() -> NodeRuntime | None:
    """The runtime of the calling node thread; a child process of a node: one made from the
    node's ticket (:func:`tlaunch.runtime.debugger.share`); None outside any node."""
    rt = context.current_or_none()
    if isinstance(rt, NodeRuntime) and rt.key is not None:
        return rt
    return _child_runtime()


_child: list[NodeRuntime] = []  # the one made from this process's ticket, once made


def _child_runtime() -> NodeRuntime | None:
    """A runtime of the node whose child this process is, from its ticket (made once); None
    without a ticket, or once its node is gone."""
    path = os.environ.get(TICKET)
    if not path:
        return None
    with _locks_lock:
        if not _child:
            try:
                with open(path, "rb") as f:
                    config, address, key = pickle.load(f)
            except (OSError, pickle.UnpicklingError, EOFError, ValueError):
                return None
            client = RPCClient(
                "coordinator",
                config.keys,
                fixed_resolver(address),
                resolve_timeout=config.coordinator_lost_after,
                default_timeout=30.0,
                retry_refused=False,
                shared_memory=False,
                tls_server=True,  # as every coordinator's client (RPCServer's tls_client)
            )
            runtime = NodeRuntime(config, client, key)
            runtime.start_watcher()  # its stop event follows the run's: a stop ends a wait
            _child.append(runtime)
        return _child[0]


class _TicketLock:
    """The lock of a node's children's pauses: ``flock`` on the node's ticket (one at a time)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._file: Any = None

    def acquire(self) -> None:
        import fcntl

        self._file = open(self._path, "rb")  # noqa: SIM115  (held until release)
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)

    def release(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()  # the lock goes with it


def _terminal(node: NodeRuntime) -> bool:
    """Whether ``node`` is a thread of a run that only this process reaches (its coordinator is
    this process's and unserved: ``local_mt``), in a process with a terminal: its pdb is that
    terminal, as Python's own would be."""
    address = getattr(node.coordinator, "address", "")
    return address is None and sys.stdin is not None and sys.stdin.isatty()


def _lock(key: str) -> threading.Lock | _TicketLock:
    if _child and os.environ.get(TICKET):
        return _TicketLock(str(os.environ[TICKET]))
    with _locks_lock:
        return _one_at_a_time.setdefault(key, threading.Lock())


def set_trace(frame: FrameType | None = None) -> None:
    """Pause the calling node here until a debugger attaches (``tlaunch debug RUN NODE``).

    Outside any node, :func:`pdb.set_trace` (the terminal's own pdb).
    """
    frame = frame or sys._getframe(1)
    node = _node()
    if node is None:
        import pdb

        pdb.Pdb().set_trace(frame)
        return
    _Session(node, BREAKPOINT).pdb.set_trace_at(frame)


def post_mortem(exc: BaseException) -> str:
    """Hold the calling node at ``exc`` (which it raised) until a debugger has seen it, the
    run stops, or the post-mortem wait ends; returns what came of it (for the failure report)."""
    node = _node()
    tb: TracebackType | None = exc.__traceback__
    if node is None or node.key is None or tb is None:
        return "no post-mortem (not in a node)"
    session = _Session(node, POST_MORTEM, f"{type(exc).__name__}: {exc}")
    session.pdb.post_mortem_of(exc)
    return session.outcome


def in_node() -> bool:
    """Whether the calling thread is a node's."""
    return _node() is not None
