"""The coordinator of one run: address registry, node states, exit codes, stop.

It is an ordinary object; the launcher serves it over RPC (sealed with the run's
keys) so nodes in other processes and on other hosts reach it. Every method is
safe to call from many threads; the waiting ones block, so long polls cost no
CPU: on the one condition every change notifies (``resolve``, ``wait_ready``),
or on the stop's own event (``wait_stop``).

(Over 400 lines: the registry, the node state machine and its long polls share
one lock and one condition, and read best in one place.)
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from tlaunch.runtime import states
from tlaunch.runtime.noderecord import NodeRecord
from tlaunch.runtime.observed import Observed, Windows

if TYPE_CHECKING:
    from tlaunch.plan import LaunchPlan


__all__ = ["CLOSE_DRAIN", "Coordinator", "NodeRecord"]

CLOSE_DRAIN = 1.0
"""Seconds a coordinator's server, closing, gives its running calls to reply: the call that
ended the run (the last node's ``node_finished``) still gets its answer."""


class Coordinator(Observed):
    """Registry and state machine of a run (served to its nodes over RPC)."""

    def __init__(
        self, plan: LaunchPlan, on_failure: str = "stop", stop_grace: float = 5.0, failure_grace: float = 1.0
    ) -> None:
        if on_failure not in states.FAILURE_POLICIES:
            raise ValueError(f"on_failure {on_failure!r} is not one of {states.FAILURE_POLICIES}")
        self.run_id = plan.run_id
        self.on_failure = on_failure
        self.grace = stop_grace
        self.failure_grace = min(stop_grace, failure_grace)
        self._for_failure = False  # the stop was begun by a node's failure
        self.attached = True
        self.launcher_seen = time.time()
        self.leased = False  # the launcher has renewed its lease at least once
        self.released = threading.Event()
        self.created = time.time()
        self.start_timeout = 120.0
        self._cond = threading.Condition()
        self._nodes: dict[str, NodeRecord] = {}
        for spec in plan.nodes:
            self._nodes[spec.key] = NodeRecord(spec.key, str(spec.host or "localhost"))
        self._placed = tuple(self._nodes.values())  # the plan's nodes (colocated children join later)
        self._stopping = False
        self._stopped = threading.Event()  # set with _stopping: the stop's long polls wait on it alone
        self._stop_reason: str | None = None
        self._stop_kind: str | None = None
        self._failure: NodeRecord | None = None
        self._children: dict[str, str] = {}  # colocated child key -> parent key
        self._changes = 0  # counts every change a summary shows (heartbeats aside)
        self._stamps: dict[str, int] = {}  # each node's record: the change count of its last change
        self._windows = Windows()  # each node's recent resource samples (runtime.observed)

    # -- registry -------------------------------------------------------
    def register(self, key: str, address: str) -> None:
        """Record that node ``key`` serves at ``address``."""
        with self._cond:
            self._record(key).address = address
            self._changed(key)

    def resolve(self, key: str, previous: str | None, timeout: float) -> dict[str, Any]:
        """Wait up to ``timeout`` s for an address of ``key`` other than ``previous``.

        Returns:
            ``{"address": str | None, "state": str}``; the address is None if
            none came in time or the node has ended; a failed node's answer
            also has its ``record`` (exit code, reason, traceback).
        """
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            rec = self._record(key)
            while True:
                if rec.address is not None and rec.address != previous:
                    return {"address": rec.address, "state": rec.state}
                if rec.state in states.TERMINAL_STATES or self._stopping:
                    answer: dict[str, Any] = {"address": None, "state": rec.state}
                    if rec.state == states.FAILED:
                        answer["record"] = asdict(rec)
                    return answer
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"address": None, "state": rec.state}
                self._cond.wait(min(left, 1.0))

    # -- node lifecycle -------------------------------------------------
    def node_started(self, key: str, pid: int, pgid: int) -> None:
        """A node process is up (``pid`` in process group ``pgid``)."""
        with self._cond:
            rec = self._record(key)
            rec.pid, rec.pgid, rec.paused, rec.debugged = pid, pgid, None, None
            rec.started_at = rec.last_seen = time.time()
            if rec.state in (states.PENDING, states.RESTARTING):
                rec.state = states.STARTING
            self._changed(key)

    def set_state(self, key: str, state: str) -> None:
        """A node reports ``running`` (it has a run phase) or ``serving``."""
        if state not in (states.RUNNING, states.SERVING):
            raise ValueError(f"state {state!r} is not one of 'running', 'serving'")
        with self._cond:
            rec = self._record(key)
            if rec.state not in states.TERMINAL_STATES:
                rec.state = state
            self._changed(key)

    def node_finished(
        self,
        key: str,
        ok: bool,
        traceback: str | None = None,
        exit_code: int | None = None,
        reason: str | None = None,
        output: str | None = None,
    ) -> None:
        """A node ended: cleanly (non-zero exit: stopped, never done), or failing with a traceback,
        an exit code and ``output``, its last lines (its traceback if it noted none: a command's)."""
        with self._cond:
            rec = self._record(key)
            if rec.state in states.TERMINAL_STATES:
                if not ok and rec.exit_code is None:
                    rec.exit_code = exit_code
                    self._changed(key)
                return
            rec.finished_at = time.time()
            rec.address = rec.paused = None
            rec.exit_code = exit_code if exit_code is not None else (0 if ok else None)
            if ok:
                stopped = self._stopping and rec.state != states.RUNNING
                rec.state = states.STOPPED if stopped or rec.exit_code else states.DONE
            else:
                why = [r for r in (reason, rec.debugged) if r]  # debugged: what its post-mortem came to
                rec.state, rec.reason = states.FAILED, "; ".join(why) or None
                rec.traceback = traceback or rec.traceback or output
                if self._failure is None and not self._stopping:
                    self._failure = rec
                    if self.on_failure == "stop":
                        self._for_failure = True
                        self._begin_stop(f"node {key!r} failed", states.FAILURE)
            self._check_complete()
            self._changed(key)

    def note_traceback(self, key: str, traceback: str) -> None:
        """A supervised node raised: keep its traceback for the report of its end."""
        with self._cond:
            self._record(key).traceback = traceback
            self._changed(key)

    def node_restarting(self, key: str, exit_code: int | None, reason: str) -> None:
        """A supervised node ended badly and will be started again."""
        with self._cond:
            rec = self._record(key)
            if rec.state in states.TERMINAL_STATES:
                return
            rec.state, rec.address, rec.exit_code, rec.paused = states.RESTARTING, None, exit_code, None
            rec.restarts += 1
            rec.reason = f"restart {rec.restarts}: {reason}"
            self._changed(key)

    def supervisor_started(self, key: str, pid: int) -> None:
        """The supervisor of ``key`` (pid ``pid``) is up; it heartbeats from now on."""
        with self._cond:
            rec = self._record(key)
            rec.supervisor_pid = pid
            rec.last_seen = time.time()
            self._changed(key)

    def heartbeat(self, key: str) -> bool:
        """Note that ``key`` is alive; returns whether the run is stopping."""
        with self._cond:
            self._record(key).last_seen = time.time()
            return self._stopping

    # -- stop -----------------------------------------------------------
    def stop(self, reason: str = "stop() was called", kind: str = states.REQUESTED) -> None:
        """Ask every node to stop; idempotent (the first reason and kind stand).

        ``kind``: ``requested`` (from outside the program: ``Run.stop()``, ``tlaunch
        stop``, a signal) or ``completed`` (the program ended itself: ``lp.stop()``
        in a node).
        """
        if kind not in states.STOP_KINDS:
            raise ValueError(f"kind {kind!r} is not one of {states.STOP_KINDS}")
        with self._cond:
            self._begin_stop(reason, kind)

    def stop_grace(self) -> float:
        """Seconds nodes get to end after the current stop, before SIGTERM.

        A stop begun by a node's failure gives the others ``failure_grace`` only:
        the root cause is known, and peers blocked in a collective or a sleep
        would not end by themselves.
        """
        with self._cond:
            return self.failure_grace if self._for_failure else self.grace

    def wait_stop(self, key: str | None = None, timeout: float = 2.0) -> bool:
        """Long poll: block up to ``timeout`` s; True once the run is stopping.

        It waits on the stop alone: answering each poll at every change of any
        node would cost every node a round trip a change (N squared calls while N
        nodes start), and even waking each poll to look would cost the coordinator
        as much in thread switches (every supervisor's and node's poll, at every
        change while they start).
        """
        if key is not None:
            with self._cond:
                self._record(key).last_seen = time.time()
        return self._stopped.wait(timeout)

    def wait_ready(self, keys: list[str] | None = None, timeout: float | None = 2.0) -> bool:
        """Long poll: block up to ``timeout`` s (None: no limit) until every node of ``keys`` (None:
        every node placed) is up: it serves (its address is registered), runs, or is done.

        Returns:
            Whether they are; False on timeout, or once the run stops with one of them not up
            (it failed, or was stopped first).
        """
        with self._cond:
            recs = self._placed if keys is None else [self._record(k) for k in keys]

            def up() -> bool:
                return all(states.is_up(r.state, r.address) for r in recs)

            limit = None if timeout is None else max(0.0, timeout)
            self._cond.wait_for(lambda: self._stopping or up(), limit)
            return up()

    # -- launcher lease and health ---------------------------------------
    def renew(self, seen: int = -1) -> tuple[int, dict[str, Any] | None]:
        """The launcher's lease, renewed; what changed since change ``seen``.

        Returns:
            The change count, and None if nothing changed since ``seen``, else :meth:`summary`
            with the records changed since then only, and ``"since": seen`` (whole for -1). A
            launcher renews every 0.5 s: while hundreds of nodes start, whole summaries
            twice a second cost both sides more than the rest of the launch.
        """
        with self._cond:
            self.launcher_seen = time.time()
            self.leased = True
            if seen == self._changes:
                return self._changes, None
            return self._changes, self._summary(seen if 0 <= seen < self._changes else -1)

    def detach(self) -> None:
        """The launcher leaves; the run goes on without it."""
        with self._cond:
            self.attached = False

    def release(self) -> None:
        """The launcher has read the final state: the coordinator may exit."""
        self.released.set()

    def check_health(self, heartbeat_timeout: float, launcher_timeout: float) -> None:
        """Fail nodes whose heartbeats stopped; stop the run if an attached launcher vanished.

        Before its first lease the launcher gets ``start_timeout``, as a node
        gets to start: it learns this coordinator's address only once the head
        is up, and may still be starting hundreds of hosts on a busy machine.
        """
        now = time.time()
        if not self.leased:
            launcher_timeout = max(launcher_timeout, self.start_timeout)
        with self._cond:
            if self.attached and not self._stopping and now - self.launcher_seen > launcher_timeout:
                self._begin_stop(
                    f"the launcher stopped answering for {now - self.launcher_seen:.0f} s "
                    "and the run was not detached",
                    states.REQUESTED,
                )
            lost = [
                r
                for r in self._top_level()
                if r.state not in states.TERMINAL_STATES
                and r.last_seen is not None
                and now - r.last_seen > heartbeat_timeout
            ]
            never = [
                r
                for r in self._top_level()
                if r.state == states.PENDING
                and r.last_seen is None
                and now - self.created > self.start_timeout
            ]
        for rec in never:
            self.node_finished(
                rec.key, False, None, None, f"did not start within {self.start_timeout:.0f} s (see its log)"
            )
        for rec in lost:
            self.node_finished(
                rec.key,
                False,
                None,
                None,
                f"its host {rec.host} stopped answering for {now - (rec.last_seen or now):.1f} s",
            )

    def summary(self) -> dict[str, Any]:
        """Status, stop reason and first failure in one answer."""
        with self._cond:
            return self._summary(-1)

    def _summary(self, since: int) -> dict[str, Any]:
        """:meth:`summary`, with the records changed after change ``since`` only (and ``since``)."""
        stamps = self._stamps  # the records flat (vars): asdict's copies cost
        status = {k: dict(vars(v)) for k, v in self._nodes.items() if since < 0 or stamps.get(k, 0) > since}
        failure = None if self._failure is None else asdict(self._failure)
        summary = {"status": status, "stopping": self._stopping, "stop_reason": self._stop_reason}
        summary.update(stop_kind=self._stop_kind, failure=failure, **({"since": since} if since >= 0 else {}))
        return summary

    # -- queries --------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """Whether the run is stopping or stopped."""
        return self._stopping

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped (first reason given)."""
        return self._stop_reason

    @property
    def stop_kind(self) -> str | None:
        """Why the stop began (one of :data:`states.STOP_KINDS`); None while the run goes on."""
        return self._stop_kind

    @property
    def failure(self) -> NodeRecord | None:
        """The first node to fail, by time."""
        return self._failure

    def status(self) -> dict[str, dict[str, Any]]:
        """Every node's record, as plain dicts (key order: program order)."""
        with self._cond:
            return {k: dict(vars(v)) for k, v in self._nodes.items()}

    def wait_ended(self, timeout: float) -> bool:
        """Wait until every node has ended; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not all(r.state in states.TERMINAL_STATES for r in self._top_level()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_ended_renew(self, timeout: float, seen: int = -1) -> tuple[bool, int, dict[str, Any] | None]:
        """:meth:`wait_ended`, then :meth:`renew`'s answer, in one call: a detached run's head
        exits once its nodes have ended, and a second call could miss their final states."""
        return (self.wait_ended(timeout), *self.renew(seen))

    def wait_stopping(self, timeout: float | None) -> bool:
        """Wait until the run is stopping; False on timeout."""
        return self._stopped.wait(timeout)

    # -- internals ------------------------------------------------------
    def _changed(self, *keys: str) -> None:
        """Something a summary shows changed (the condition is held): count it, note which nodes'
        records it changed, wake the waiters."""
        self._changes += 1
        for key in keys:
            self._stamps[key] = self._changes
        self._cond.notify_all()

    def _record(self, key: str) -> NodeRecord:
        rec = self._nodes.get(key)
        if rec is None:  # a colocated node (label/i.j, nested: label/i.j.k): its placed ancestor's child
            parent = key
            while "." in parent.rsplit("/", 1)[-1] and (parent == key or parent not in self._nodes):
                parent = parent.rsplit(".", 1)[0]
            if parent == key or parent not in self._nodes or parent in self._children:
                raise KeyError(f"no node {key!r} in run {self.run_id!r}")
            rec = self._nodes[key] = NodeRecord(key, self._nodes[parent].host)
            self._children[key] = parent
        return rec

    def _top_level(self) -> list[NodeRecord]:
        return [r for k, r in self._nodes.items() if k not in self._children]

    def _begin_stop(self, reason: str, kind: str) -> None:
        if not self._stopping:
            self._stopping = True
            self._stop_reason = reason
            self._stop_kind = kind
            self._stopped.set()  # after the reason: a waiter that wakes reads it at once
        self._changed()

    def _check_complete(self) -> None:
        top = self._top_level()
        if any(r.state in (states.PENDING, states.STARTING, states.RUNNING, states.RESTARTING) for r in top):
            return
        if any(r.state == states.DONE for r in top):
            self._begin_stop("every node with a run() finished", states.COMPLETED)
        elif all(r.state in states.TERMINAL_STATES for r in top):
            self._begin_stop("every node has ended", states.COMPLETED)
