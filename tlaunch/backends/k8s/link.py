"""The launcher's view of a program's coordinator in its pod: :class:`LPJobLink`, over the Kubernetes API.

The coordinator runs in the job's coordinator pod, which the launcher need
not be able to reach (pod IPs are the cluster's). A thread of the launcher
reads the LPJob and its pods every half second instead: while the job runs,
each pod is its node's state; once the operator marks the job Succeeded or
Failed, the coordinator is ending the nodes, and when its pod has exited its
log holds the run's final report (every node's end, the stop's reason and
kind, the first failure with its traceback). The run is settled then, or
when the LPJob is deleted, or when no report came in time (the root cause is
then the first pod to fail, with the traceback of its log).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

from tlaunch.backends.handle import NodeStatus
from tlaunch.backends.k8s import observe
from tlaunch.backends.k8s.api import JobAPI
from tlaunch.errors import LaunchError
from tlaunch.runtime.coordinator import NodeRecord
from tlaunch.runtime.states import is_up

__all__ = ["LPJobLink"]

log = logging.getLogger(__name__)

POLL = 0.5
REPORT_WAIT = 20.0
"""Seconds a finished job's coordinator has, beyond the run's grace, to print its final report."""


class LPJobLink:
    """A :class:`~tlaunch.backends.base.CoordinatorLink` to the coordinator of an LPJob run.

    Args:
        api: the job's LPJob and pods.
        address: the coordinator's address in the cluster (recorded; nodes use it).
        stop_grace: seconds nodes get after a stop.
    """

    def __init__(self, api: JobAPI, address: str, stop_grace: float) -> None:
        self.api = api
        self.address: str | None = address
        self._grace = stop_grace
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._closed = threading.Event()
        self._job: dict[str, Any] | None = None
        self._pods: list[dict[str, Any]] = []
        self._final: dict[str, Any] | None = None
        self._failure: NodeRecord | None = None
        self._reason: str | None = None
        self._kind: str | None = None
        self._requested = False
        self._ended_at: float | None = None
        self._lines: dict[str, list[str]] = {}  # a node's announcements (debugger), from its output
        self._thread = threading.Thread(target=self._follow, name=f"tlaunch-lpjob-{api.name}", daemon=True)
        self._thread.start()

    # -- the thread -------------------------------------------------------------
    def _follow(self) -> None:
        while not self._closed.is_set() and not self._settled.is_set():
            try:
                self._poll()
            except LaunchError as exc:  # a moment without the cluster: ask again
                log.warning("LPJob %s: %s", self.api.name, exc)
            self._closed.wait(POLL)

    def _poll(self) -> None:
        job = self.api.job()
        if job is None:
            self._settle(f"LPJob {self.api.namespace}/{self.api.name} was deleted", "requested")
            return
        pods = self.api.pods(job)
        with self._lock:
            self._job, self._pods = job, pods
        if observe.job_state(job, pods).ended:
            self._ended_at = self._ended_at or time.monotonic()
            coordinator = [p for p in pods if observe.pod_key(job, p) == observe.COORDINATOR]
            late = time.monotonic() - self._ended_at > self._grace + REPORT_WAIT
            if coordinator and observe.ended_pods(coordinator):
                self._final = observe.final_report(self.api.log(coordinator[0]["metadata"]["name"]))
            if self._final is not None or late or not coordinator or observe.ended_pods(coordinator):
                self._settle_ended(job, pods)

    def _settle_ended(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        final = self._final
        if final is not None:
            failure = final.get("failure")
            self._failure = NodeRecord(**failure) if failure else None
            self._settle(final.get("stop_reason"), final.get("stop_kind"))
            return
        pod = observe.failed_pod(pods)
        if pod is not None:  # no report: the first pod to fail, with its log's traceback
            f = observe.pod_failure(job, pod, self.api.log(pod["metadata"]["name"]))
            self._failure = NodeRecord(
                f.node, f.host or "", "failed", exit_code=f.exit_code, traceback=f.traceback, reason=f.reason
            )
        reason = (job.get("status") or {}).get("reason")
        self._settle(reason, "failed" if self._failure else "completed")

    def _settle(self, reason: str | None, kind: str | None) -> None:
        with self._lock:
            if self._reason is None:
                self._reason, self._kind = reason, kind
        self._settled.set()

    # -- CoordinatorLink --------------------------------------------------------
    @property
    def settled(self) -> bool:
        """Whether the run has ended (and its final state is known, or will not be)."""
        return self._settled.is_set()

    @property
    def reported(self) -> bool:
        """Whether the coordinator's final report was read (its pod has exited)."""
        return self._final is not None

    @property
    def ended_by_itself(self) -> bool:
        """Whether the job ended without a stop from here (its pods are the cluster's to keep)."""
        return self._settled.is_set() and not self._requested

    def status(self) -> dict[str, dict[str, Any]]:
        """Every node's record: the final report's once there, else its pod's."""
        if self._final is not None:
            return dict(self._final.get("status") or {})
        with self._lock:
            job, pods = self._job, self._pods
        if job is None:
            return {}
        with self._lock:
            said = {observe.pod_name(job, key): "\n".join(lines) for key, lines in self._lines.items()}
        return {n.key: dataclasses.asdict(n) for n in observe.nodes(job, pods, said)}

    def saw(self, key: str, line: str) -> None:
        """A line of node ``key``'s output (the launcher shows them): one saying that it waits in a
        debugger, or goes on, is kept for its state (``paused``)."""
        if "tlaunch" in line and "debug" in line:
            with self._lock:
                kept = self._lines.setdefault(key, [])
                kept.append(line)
                del kept[:-8]

    def wait_ready(self, keys: list[str] | None, timeout: float | None) -> bool:
        """Wait until every node of ``keys`` (None: all) is up as its pod shows it (looked at every
        ``POLL`` s); False on timeout, or once the run has ended with one of them not up."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            recs = [status.get(k, {}) for k in (status if keys is None else keys)]
            if status and all(is_up(r.get("state"), r.get("address")) for r in recs):
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if self._settled.is_set() or (left is not None and left <= 0):
                return False
            self._settled.wait(POLL if left is None else min(POLL, left))

    def node_statuses(self) -> tuple[NodeStatus, ...]:
        """Every node, as :class:`NodeStatus`."""
        return tuple(NodeStatus.from_record(r) for r in self.status().values())

    @property
    def stopping(self) -> bool:
        """Whether the run is stopping or has stopped."""
        with self._lock:
            job, pods = self._job, self._pods
        return self._requested or self.settled or (job is not None and observe.job_state(job, pods).ended)

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped."""
        return self._reason

    @property
    def failure(self) -> NodeRecord | None:
        """The first node to fail (from the final report, else the first pod to fail)."""
        return self._failure

    @property
    def stop_kind(self) -> str | None:
        """Why the stop began: ``completed``, ``requested`` or ``failed``."""
        return self._kind

    def stop(self, reason: str = "stop() was called", kind: str = "requested") -> None:
        """Note a stop from here (the backend deletes the LPJob); a run that has ended keeps its end."""
        with self._lock:
            if self._settled.is_set() or self._reason is not None:
                return
            self._reason, self._kind, self._requested = reason, kind, True
        self._settled.set()

    def stop_grace(self) -> float:
        """Seconds nodes get after a stop."""
        return self._grace

    def wait_stopping(self, timeout: float | None) -> bool:
        """Wait until the run has ended (its final state known) or a stop was asked; False on timeout."""
        return self._settled.wait(timeout)

    def wait_ended(self, timeout: float) -> bool:
        """Wait until the run has ended; False on timeout."""
        return self._settled.wait(timeout)

    def release(self) -> None:
        """Nothing to release: the coordinator in its pod exits by itself."""

    def detach(self) -> None:
        """The launcher leaves: stop following the job."""
        self.close()

    def close(self) -> None:
        """Stop following the job; idempotent."""
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def resolve(self, key: str, previous: str | None, timeout: float) -> dict[str, Any]:
        """Refused: the launcher is outside the cluster's network.

        Raises:
            LaunchError: always.
        """
        raise LaunchError(
            f"handle of {key!r} cannot be dereferenced in the launcher of a Kubernetes run: its nodes "
            "are reached at pod IPs, inside the cluster; call it from a node of the program"
        )

    def wait_stop(self, key: str | None = None, timeout: float = 2.0) -> bool:
        """True once the run is stopping (a long poll of ``timeout`` s)."""
        self._settled.wait(timeout)
        return self.stopping
