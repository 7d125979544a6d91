"""A launched program, as the launcher holds it: wait for it, stop it, ask its status.

Launchpad's ``Run`` API (waits on groups, a test's cleanup) and the
:class:`~tlaunch.backends.handle.RunHandle` view of the same run; how it ends
(the teardown order, interrupts held, its end recorded) is :mod:`tlaunch.run_end`'s.
The same :class:`Run` serves every backend: it talks to the run's coordinator
through a :class:`~tlaunch.backends.base.CoordinatorLink` (wherever that
coordinator lives) and asks the backend only to stop or detach its processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from tlaunch import context
from tlaunch.backends import get_backend
from tlaunch.backends.base import Backend, CoordinatorLink
from tlaunch.backends.handle import Failure, LogLine, NodeStatus, RunSnapshot, ended_state
from tlaunch.backends.observed import raise_for
from tlaunch.backends.runstates import live_state
from tlaunch.errors import LaunchError, RunFailedError, builtin_exception_type
from tlaunch.hints import hint
from tlaunch.plan import LaunchPlan
from tlaunch.run_end import RunEnd
from tlaunch.runtime.node_runtime import NodeRuntime
from tlaunch.runtime.records import RunRecord, write_record
from tlaunch.runtime.results import JobResult, read_result
from tlaunch.runtime.states import TERMINAL_STATES
from tlaunch.workers import NodeWorker

__all__ = ["Run"]

log = logging.getLogger(__name__)


class Run:
    """A launched program: wait for it, stop it, ask its status.

    Use as a context manager to stop it on exit::

        with launch(program, wait=False) as run:
            client = handle.dereference()
            ...
    """

    def __init__(
        self,
        plan: LaunchPlan,
        coordinator: CoordinatorLink,
        backend: Backend,
        run_dir: str,
        launcher_runtime: NodeRuntime,
        record: RunRecord | None = None,
        launch_times: dict[str, float] | None = None,
        launch_type: str = "",
        workers_exited_error: bool = False,
    ) -> None:
        self.plan = plan
        self.run_id = plan.run_id
        self.run_dir = run_dir
        self.launch_type = launch_type
        """The launch type asked for (``local_mp``, ``test_mt``...)."""
        self._workers_exited_error = workers_exited_error  # Launchpad's test_mp: RuntimeError
        self.launch_times = dict(launch_times or {})
        """Seconds each phase of the launch took (connect, preflight, ship...)."""
        self._coord = coordinator
        self._backend = backend
        self._runtime = launcher_runtime
        self._record = record
        self._end = RunEnd(plan.run_id, run_dir, coordinator, backend, launcher_runtime, record)
        self._reported = False
        self._failure_raised = False  # by wait(): a test's cleanup raises it otherwise
        self._lock_report = threading.Lock()

    @property
    def detached(self) -> bool:
        """Whether the launcher left the run going without it (:meth:`detach`)."""
        return self._end.detached

    @property
    def backend(self) -> str:
        """The name of the backend that placed the run (``local_mp``, ``ssh``, ``slurm``...)."""
        return self._record.backend if self._record is not None else self.launch_type

    def snapshot(self) -> RunSnapshot:
        """The run now, as every kind of run answers it (:class:`~tlaunch.backends.handle.RunHandle`)."""
        nodes = [NodeStatus.from_record(r) for r in self._coord.status().values()]
        first = self._coord.failure
        report = self._end.outcome_failure if first is None else dataclasses.asdict(first)
        failure = None if report is None else Failure.from_report(report)
        if self._end.torn_down:
            state = ended_state(failure, self._coord.stop_kind)
        else:
            state = live_state(nodes, stopping=self._coord.stopping)
        record = self._record
        return RunSnapshot(
            run_id=self.run_id,
            backend=self.backend,
            program=self.plan.program_name,
            state=state,
            nodes=tuple(nodes),
            reason=self._coord.stop_reason,
            failure=failure,
            hosts=tuple(record.hosts) if record is not None else (),
            created=record.created if record is not None else None,
            refs=dict(record.refs) if record is not None else {},
        )

    def logs(self, node: str | None = None, *, follow: bool = False) -> Iterator[LogLine]:
        """Each node's log lines (node ``node``'s only); with ``follow``, until the run ends.

        Raises:
            LaunchError: the run keeps no logs (threads print to the launcher's terminal).
            KeyError: the run has no log of node ``node``.
        """
        if self._record is None:
            raise LaunchError(
                f"run {self.run_id} ({self.launch_type}) keeps no log files: its nodes print to this "
                "terminal; launch with launch_type='local_mp' to have logs"
            )
        handle = get_backend(self._record.backend).attach(self.run_dir, self._record)
        return handle.logs(node, follow=follow)

    def results(self) -> JobResult | None:
        """How the run's job ended, when a job's entry point launched it and wrote it in the run's folder."""
        return read_result(self.run_dir)

    def join(self, timeout: float | None = None) -> RunSnapshot:
        """Block until the run has ended; its final snapshot (:meth:`RunHandle.join`: the contract of
        every handle; Launchpad's :meth:`wait` -> bool stays as it is).

        Raises:
            RunFailedError: it failed: the first node to fail (also of its own exception type), or
                the root cause its launcher gave (``stop(kind="failed", failure=...)``).
            TimeoutError: it had not ended after ``timeout`` s (it goes on).
            LaunchError: the launcher detached from it (join it with ``control.find_run``).
        """
        if not self.wait(timeout=timeout, raise_error=False):
            if self.detached:
                raise LaunchError(
                    f"run {self.run_id} was detached from this launcher; join it through the run store, "
                    f"which finds it by its id: control.find_run({self.run_id!r}).join()"
                )
            raise TimeoutError(f"run {self.run_id} is still {self.snapshot().state} after {timeout} s")
        failure = self.failure()
        if failure is not None:
            self._failure_raised = True
            raise failure
        return raise_for(self.snapshot())

    @property
    def log_dir(self) -> str:
        """Where each node's output is logged (``<label>_<i>.log``)."""
        return os.path.join(self.run_dir, "logs")

    def status(self) -> dict[str, dict[str, Any]]:
        """Every node's state (``pending``, ``running``, ``serving``, ``done``, ``failed``...)."""
        return self._coord.status()

    @property
    def done(self) -> bool:
        """Whether the run has ended (finished, stopped or failed)."""
        return self._coord.stopping

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped (every node finished, ``stop()``, a failure...); None while it runs."""
        return self._coord.stop_reason

    def failure(self) -> RunFailedError | None:
        """The error of the first node to fail, or None."""
        rec = self._coord.failure
        if rec is None:
            return None
        cause = self._backend.exceptions.get(rec.key)
        kind: type[BaseException] | None = (
            type(cause) if cause is not None else builtin_exception_type(rec.traceback)
        )
        reason = rec.reason or ""
        if self._workers_exited_error:  # Launchpad's test_mp raises this RuntimeError
            kind, reason = RuntimeError, f"{reason or 'failed'} (One of the workers exited.)"
        err = RunFailedError(rec.key, rec.host, rec.exit_code, rec.traceback, reason, hint(rec)).as_kind(kind)
        if cause is not None:
            err.__cause__ = cause
        return err

    def wait(
        self,
        labels_to_wait_for: Sequence[str] | float | None = None,
        raise_error: bool = True,
        return_on_first_completed: bool = False,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Block until the program ends (every node with ``run()`` returned, or stop).

        ``run.wait(30)`` waits 30 s at most. Launchpad's form waits for some
        groups only: ``run.wait(["main"])`` returns once the nodes labelled
        ``main`` have ended (or the first of them, ``return_on_first_completed``)
        while the others go on; a failure anywhere still ends it.

        Returns:
            True once the run (or the groups waited for) has ended; False on
            timeout, or when the launcher detached from the run (SSH runs: Ctrl-\\).

        Raises:
            RunFailedError: a node failed (``raise_error``); names the first to
                fail, with its traceback, and is also of the node's own exception
                type where Python allows.
        """
        if isinstance(labels_to_wait_for, (int, float)) and not isinstance(labels_to_wait_for, bool):
            timeout, labels_to_wait_for = float(labels_to_wait_for), None
        if labels_to_wait_for and not isinstance(labels_to_wait_for, (bool, int, float)):
            labels = [str(label) for label in labels_to_wait_for]
            return self._wait_for_groups(labels, raise_error, return_on_first_completed, timeout)
        if not self._coord.wait_stopping(timeout) or self.detached:
            return False
        self._report_failure()
        self._end.teardown()
        failure = self.failure()
        if failure is not None and raise_error:
            self._failure_raised = True
            raise failure
        if self._end.stop_error is not None:
            raise self._end.stop_error
        return True

    def wait_ready(self, labels: Sequence[str] | None = None, *, timeout: float | None = None) -> bool:
        """Block until every node (or every node of groups ``labels``) is up: it serves its
        methods, runs, or is already done (one long poll: the coordinator answers then).

        Returns:
            True once they are up; False on timeout, or when the run stopped first.

        Raises:
            LaunchError: a label names no group of the program.
            RunFailedError: a node failed before they were all up (the first to fail).
        """
        keys = None if labels is None else self._keys_of([labels] if isinstance(labels, str) else labels)
        if self._coord.wait_ready(keys, timeout):
            return True
        failure = self.failure()
        if failure is not None:
            self._failure_raised = True
            raise failure
        return False

    def cleanup_after_test(self, test_case: object = None) -> None:
        """Stop the run; a node's failure that no ``wait()`` raised fails the test (Launchpad's name).

        ``launch(..., test_case=t)`` makes it ``t``'s cleanup.
        """
        self.stop()
        failure = self.failure()
        if failure is not None and not self._failure_raised:
            raise failure

    def _wait_for_groups(
        self, labels: list[str], raise_error: bool, first: bool, timeout: float | None
    ) -> bool:
        keys = self._keys_of(labels)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self._coord.status()
            ended = [k for k in keys if status.get(k, {}).get("state") in TERMINAL_STATES]
            if self._coord.stopping:
                return self.wait(raise_error=raise_error)  # a failure or a stop: the whole run ends
            if len(ended) == len(keys) or (first and ended):
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def _keys_of(self, labels: Sequence[str]) -> list[str]:
        """The keys of the nodes of groups ``labels``; a label that is no group is refused."""
        known = {n.label for n in self.plan.nodes}
        unknown = sorted(set(labels) - known)
        if unknown:
            raise LaunchError(f"run {self.run_id} has no groups {unknown}; its groups: {sorted(known)}")
        return [n.key for n in self.plan.nodes if n.label in labels]

    @property
    def _active_workers(self) -> dict[str, list[NodeWorker]]:
        """Each group's nodes, as Launchpad's worker manager lists them (``wait()``, ``returncode``)."""
        groups: dict[str, list[NodeWorker]] = {}
        for n in self.plan.nodes:
            groups.setdefault(n.label, []).append(NodeWorker(self.status, n.key))
        return groups

    def stop(
        self,
        *,
        reason: str = "Run.stop() was called",
        kind: str = "requested",
        failure: dict[str, Any] | None = None,
    ) -> None:
        """Stop every node and wait until none is left; idempotent.

        ``kind`` says how the run ended: ``requested`` (stopped from outside: it ends
        STOPPED), ``completed`` (its work is done: SUCCEEDED) or ``failed`` (FAILED,
        ``reason`` saying why): a launcher that judges the outcome itself (a torch job's
        collector) says so, with its root cause as ``failure`` (a report: a rank, its
        host...) where no node failed, in the run's end record as it says the run ended.
        """
        if self.detached:
            raise LaunchError(f"run {self.run_id} was detached; stop it with `tlaunch stop {self.run_id}`")
        self._end.outcome_failure = failure
        self._coord.stop(reason, kind)
        self._end.teardown()
        if self._end.stop_error is not None:
            raise self._end.stop_error

    def detach(self) -> None:
        """Leave the run going without this launcher (backends that can: SSH).

        ``tlaunch ps``, ``logs``, ``attach`` and ``stop`` find it again by its id.
        """
        if not getattr(type(self._backend), "can_detach", False):
            raise LaunchError(
                f"run {self.run_id} runs on this machine and cannot outlive its launcher; "
                "detach needs an SSH launch (nodes placed with .to_host())"
            )
        if not self._end.mark_detached():
            return
        self._backend.detach()
        self._runtime.close()
        context.uninstall_if(self._runtime)
        if self._record is not None:
            self._record.detached = True
            self._record.launcher_pid = None
            write_record(self.run_dir, self._record)
        sys.stderr.write(
            f"tlaunch: detached from run {self.run_id}; it goes on. "
            f"`tlaunch ps {self.run_id}`, `tlaunch logs -f {self.run_id}`, "
            f"`tlaunch attach {self.run_id}`, `tlaunch stop {self.run_id}`\n"
        )

    def watch(self) -> None:
        """Tear the run down in the background as soon as it stops, whoever stops it.

        A run that ends by itself (its nodes finished or failed, ``tlaunch
        stop``) while nobody waits for it (``wait=False`` in a notebook) is
        still torn down and recorded as ended.
        """
        threading.Thread(target=self._reap, name=f"tlaunch-reaper-{self.run_id}", daemon=True).start()

    def _reap(self) -> None:
        if self._coord.wait_stopping(None) and not self.detached:
            self._report_failure()
            self._end.teardown()

    def _report_failure(self) -> None:
        """Say the root cause on the launcher's terminal the moment it is known (once)."""
        failure = self.failure()
        with self._lock_report:
            if failure is None or self._reported:
                return
            self._reported = True
        with contextlib.suppress(OSError, ValueError):  # no terminal left to tell
            sys.stderr.write(f"tlaunch: run {self.run_id} stops: {failure}\n")
            sys.stderr.flush()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, done={self.done})"
