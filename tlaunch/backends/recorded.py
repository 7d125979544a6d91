"""A run found again from its record, whose coordinator answers over RPC: :class:`RecordedRun`.

What ``local_mp``, ``test_mp`` and ``slurm`` (in an allocation) runs have in
common once their launcher is another process: the record says where the
coordinator is (and holds the run's keys, 0600, while it runs), the node
logs are files of this machine, and the launcher tears the run down when
asked to stop. The SSH backend's handle (:mod:`tlaunch.backends.ssh.attached`)
is this class with the logs, final state and teardown on the hosts.

Nothing here prints: every answer is a value of :mod:`tlaunch.backends.handle`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tlaunch.backends.handle import Failure, LogLine, NodeStatus, RunSnapshot, RunState
from tlaunch.backends.logfiles import LogFollower, LogSteps, follow_files
from tlaunch.backends.observed import Observed
from tlaunch.backends.runstates import ended_from, live_state
from tlaunch.errors import LaunchError, RPCError, StopError
from tlaunch.plan import log_name
from tlaunch.procs import pid_alive
from tlaunch.runtime.records import (
    PREPARING_LOG,
    RunRecord,
    coordinator_client,
    launcher_alive,
    mark_ended,
    read_record,
)
from tlaunch.runtime.results import JobResult, pending_result, read_result
from tlaunch.runtime.states import REQUESTED

__all__ = ["STOPPED_PREPARING", "RecordedRun"]

LAUNCHER_GONE = "its launcher is gone (the nodes ended with it)"
PREPARER_GONE = "its launcher ended before the run started, and left no word why"
STOPPED_PREPARING = "stopped before the run started (while its launcher prepared it)"


class RecordedRun(Observed):
    """A run of this machine's records whose coordinator is reachable over RPC while it runs.

    Args:
        run_dir: the run's directory (its ``run.json``, ``run.keys``, logs).
        record: its record as read (it is read again for every answer).
    """

    outlives_launcher = False
    """Whether the run goes on without its launcher (the coordinator lives elsewhere: SSH)."""
    uses_ssh_identity = False
    """Whether reading its logs or stopping it logs in to hosts with the reader's SSH identity (a job
    server reading another account's run does that as the account)."""

    def __init__(self, run_dir: str, record: RunRecord) -> None:
        self.run_dir = run_dir
        self._record = record

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.run_id!r}, {self.backend!r})"

    @property
    def run_id(self) -> str:
        """tlaunch's id of the run."""
        return self._record.run_id

    @property
    def backend(self) -> str:
        """The backend's name, as recorded."""
        return self._record.backend

    @property
    def record(self) -> RunRecord:
        """The run's record as it is on disk now."""
        # Removed (a launch that failed) or being rewritten: the last one read stands.
        with contextlib.suppress(OSError, ValueError):
            self._record = read_record(self.run_dir)
        return self._record

    # -- state ------------------------------------------------------------
    def snapshot(self) -> RunSnapshot:
        """The run now: from its coordinator while it runs, else from its record.

        A job's run whose processes have ended is still ``STOPPING`` while its launcher (the
        job's entry point) writes how the job ended (:mod:`tlaunch.runtime.results`).
        """
        snap = self._look()
        if snap.ended and self._result_to_come(self.record):
            return dataclasses.replace(snap, state=RunState.STOPPING, reason="its job's launcher is ending")
        return snap

    def _result_to_come(self, rec: RunRecord) -> bool:
        """Whether the job's launcher (its entry point) is still to write how its run ended."""
        return pending_result(self.run_dir) and launcher_alive(rec) is not False

    def _look(self) -> RunSnapshot:
        rec = self.record
        if rec.ended:
            return self._ended(rec)
        if rec.preparing:
            return self._preparing(rec)
        if not self.outlives_launcher and launcher_alive(rec) is False:
            # Its coordinator lived in its launcher, and its nodes died with it.
            mark_ended(self.run_dir, rec, {"lost": LAUNCHER_GONE, "stop_reason": LAUNCHER_GONE})
            return self._ended(rec)
        summary = self._summary(rec)
        if summary is not None:
            return self._running(rec, summary)
        rec = self.record
        if rec.ended:  # it ended while we asked
            return self._ended(rec)
        final = self._final_elsewhere(rec)
        if final is not None:
            mark_ended(self.run_dir, rec, final)
            return self._ended(rec)
        alive = launcher_alive(rec)
        if alive:  # its coordinator is ending with the run: the record follows
            return self._snapshot(rec, RunState.STOPPING, reason="its coordinator is not answering")
        if alive is None:  # not this machine's to end: its launcher's may still record how it ended
            why = f"its coordinator at {rec.coordinator} is not answering; its launcher is on another machine"
            return self._snapshot(rec, RunState.LOST, reason=why)
        return self._snapshot(rec, RunState.LOST, reason="its coordinator is gone and left no final state")

    def _preparing(self, rec: RunRecord) -> RunSnapshot:
        """A run whose launcher is preparing it (building its runtime environment): no coordinator yet."""
        if launcher_alive(rec) is not False:  # another machine's: its launcher ends it there
            return self._snapshot(rec, RunState.PENDING, reason=rec.preparing)
        now = self.record
        if not now.preparing:  # it started (or ended) as we asked
            return self.snapshot()
        mark_ended(self.run_dir, now, {"lost": PREPARER_GONE, "stop_reason": PREPARER_GONE})
        return self._ended(now)

    def _summary(self, rec: RunRecord) -> dict[str, Any] | None:
        try:
            client = coordinator_client(self.run_dir, rec)
        except OSError:  # its keys are gone: it has ended, or is ending
            return None
        try:
            summary: dict[str, Any] = client.summary()
            return summary
        except RPCError:
            return None
        finally:
            client.close()

    def _final_elsewhere(self, rec: RunRecord) -> dict[str, Any] | None:
        """The final state of a run whose coordinator has exited, where it is kept (SSH: its head)."""
        return None

    def _running(self, rec: RunRecord, summary: dict[str, Any]) -> RunSnapshot:
        nodes = [NodeStatus.from_record(r) for r in summary.get("status", {}).values()]
        state = live_state(nodes, stopping=bool(summary.get("stopping")))
        failure = summary.get("failure")
        return self._snapshot(
            rec,
            state,
            nodes,
            reason=summary.get("stop_reason"),
            failure=Failure.from_report(failure) if failure else None,
        )

    def _ended(self, rec: RunRecord) -> RunSnapshot:
        end = ended_from(rec)
        return self._snapshot(rec, end.state, end.nodes, reason=end.reason, failure=end.failure)

    def _snapshot(
        self,
        rec: RunRecord,
        state: RunState,
        nodes: Sequence[NodeStatus] = (),
        reason: str | None = None,
        failure: Failure | None = None,
    ) -> RunSnapshot:
        refs = {
            name: str(value)
            for name, value in (("log_dir", rec.log_dir), ("head", rec.head), ("slurm_job", rec.slurm_job))
            if value
        }
        refs.update(rec.refs)
        return RunSnapshot(
            run_id=rec.run_id,
            backend=rec.backend,
            program=rec.program,
            state=state,
            nodes=tuple(nodes),
            reason=reason,
            failure=failure,
            hosts=tuple(rec.hosts),
            created=rec.created,
            refs=refs,
        )

    def wait(self, *, timeout: float | None = None, poll: float = 0.5) -> RunSnapshot:
        """Block until the run has ended; its final snapshot, failed or not (this class's own;
        :meth:`join` is every handle's, and raises the root cause).

        Raises:
            TimeoutError: it had not ended after ``timeout`` s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if snap.ended:
                return snap
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} is still {snap.state} after {timeout} s")
            time.sleep(poll)

    def results(self) -> JobResult | None:
        """How the run's job ended, as the job's entry point wrote it in the run's folder."""
        return read_result(self.run_dir)

    # -- logs -------------------------------------------------------------
    def _node_keys(self) -> list[str]:
        rec = self.record
        if rec.preparing:
            return []
        if rec.final_status:
            return list(rec.final_status)
        return [n.key for n in self.snapshot().nodes]

    def logs(self, node: str | None = None, *, follow: bool = False) -> Iterator[LogLine]:
        """Each node's log lines (node ``node``'s only, if given); with ``follow``, until the run ends.

        Logs that appear while following (nodes that start later, after a
        runtime environment's build) are followed too.

        Raises:
            KeyError: the run has no log of node ``node``.
        """
        log_dir = self.record.log_dir or os.path.join(self.run_dir, "logs")
        return self._local_logs(log_dir, node, follow, lambda: self.snapshot().ended)

    def _local_logs(
        self, log_dir: str, node: str | None, follow: bool, until: Callable[[], bool]
    ) -> Iterator[LogLine]:
        """The logs of this machine's ``log_dir`` (see :meth:`logs`); following ends once ``until()``."""
        found, files = self._log_files(log_dir, node, follow)
        return follow_files(found, lambda: not follow or until(), files if follow else None)

    def _log_files(
        self, log_dir: str, node: str | None, follow: bool
    ) -> tuple[dict[str, str], Callable[[], dict[str, str]]]:
        """The log files of ``log_dir`` now (path -> node key), and how to list them again.

        Raises:
            KeyError: no log of node ``node`` (and none may come: not following a run being prepared).
        """
        keys: dict[str, str] = {}
        seen: set[str] = set()
        asked_preparing = True  # the keys were last asked while the record said "preparing"

        def files() -> dict[str, str]:
            nonlocal asked_preparing
            names = sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []
            new = asked_preparing or not seen.issuperset(names)  # else: not preparing (it never is again)
            preparing = new and self.record.preparing is not None
            if new:  # a new log: its node's key (asked after the record: they are sure once it is False)
                asked_preparing = preparing
                keys.update({log_name(k): k for k in self._node_keys()})
                seen.update(names)
            found = {}
            for n in names:
                key = keys.get(n)
                if key is None and preparing and not n.startswith(PREPARING_LOG):
                    continue  # a node's log before the record names the run's nodes: read once it does
                key = key or n[:-4]
                if node is None or key == node:
                    found[os.path.join(log_dir, n)] = key
            return found

        found = files()
        if node is not None and not found and not (follow and self.record.preparing):
            names = sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []
            raise KeyError(f"run {self.run_id} has no log of node {node!r} in {log_dir}; logs: {names}")
        return found, files

    def log_follower(self, node: str | None = None) -> LogSteps | None:
        """Its logs (node ``node``'s) to step through (:class:`LogFollower`); the caller says the end.

        Raises:
            KeyError: the run has no log of node ``node``.
        """
        log_dir = self.record.log_dir or os.path.join(self.run_dir, "logs")
        found, files = self._log_files(log_dir, node, True)
        return LogFollower(found, files)

    # -- stop -------------------------------------------------------------
    def stop(self, timeout: float = 60.0) -> None:
        """Ask the run to stop; its launcher tears it down. Returns once it has ended.

        Raises:
            StopError: it has not ended after ``timeout`` s.
            LaunchError: its coordinator cannot be reached.
        """
        if self.snapshot().ended:
            return
        if self.record.preparing:
            self._stop_preparing(timeout)
            return
        if launcher_alive(self.record) is False:
            self._stop_without_launcher()
            return
        try:
            client = coordinator_client(self.run_dir, self.record)
        except OSError:  # its keys went: it has just ended
            return
        try:
            client.stop(f"`tlaunch stop` from pid {os.getpid()}", REQUESTED)
        except RPCError as exc:
            raise LaunchError(
                f"cannot reach run {self.run_id}'s coordinator at {self.record.coordinator}: {exc}"
            ) from exc
        finally:
            client.close()
        # Its launcher (even an idle one: a notebook) tears the run down and records its end.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = self.record  # ended: as snapshot() says it, once the job's launcher wrote how
            if (rec.ended and not self._result_to_come(rec)) or launcher_alive(rec) is False:
                return
            time.sleep(0.1)
        raise StopError(self.run_id, {"launcher": [str(self.record.launcher_pid)]})

    def _stop_preparing(self, timeout: float) -> None:
        """Stop a run whose launcher is still preparing it: SIGTERM ends the launcher and its build.

        Returns once the launcher has ended (it records the stop and its job's result as it ends):
        the run has no other process, and a stop that returned before its launcher had gone would
        leave the run ``STOPPING`` and the launcher running.

        Raises:
            StopError: the launcher is still there after ``timeout`` s.
        """
        rec = self.record
        alive = launcher_alive(rec)
        if alive is None:
            raise LaunchError(
                f"run {self.run_id} is being prepared by its launcher on another machine (pid "
                f"{rec.launcher_pid} there), which only that machine can signal: run `tlaunch stop "
                f"{self.run_id}` there, or here once the run has started"
            )
        if alive:
            assert rec.launcher_pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.launcher_pid, signal.SIGTERM)  # it records the stop as it ends
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rec = self.record
            if not rec.ended and not rec.preparing:  # it started meanwhile: stop the run itself
                self.stop(max(1.0, deadline - time.monotonic()))
                return
            if launcher_alive(rec) is False or not pid_alive(rec.launcher_pid or 0):  # (ended: a zombie)
                rec = self.record  # as it ended
                if not rec.ended:  # it ended without a word
                    mark_ended(self.run_dir, rec, {"stop_reason": STOPPED_PREPARING, "stop_kind": REQUESTED})
                return
            time.sleep(0.1)
        raise StopError(self.run_id, {"launcher": [str(rec.launcher_pid)]})

    def _stop_without_launcher(self) -> None:
        """Stop a run that no launcher holds (runs that outlive their launcher override this)."""
        self.snapshot()  # records it as ended (its nodes ended with their launcher)

    # -- terminal -----------------------------------------------------------
    def attach_argv(self, node: str | None = None) -> list[str]:
        """The command that opens the run's tmux session in this terminal (``tlaunch attach``).

        Raises:
            LaunchError: the run has no tmux session.
        """
        session = f"tlaunch-{self.run_id}"
        if shutil.which("tmux") is None or self.backend != "local_mp" or node is not None:
            raise LaunchError(f"run {self.run_id} has no tmux session; use `tlaunch logs -f {self.run_id}`")
        return ["tmux", "attach", "-t", f"={session}"]
