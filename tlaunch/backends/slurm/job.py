"""A program (or a command) submitted as a SLURM batch job: :class:`SlurmJob`, a :class:`RunHandle`.

Such a run has no coordinator on the submitting machine: SLURM knows its state
(``scontrol``), its output is ``slurm-<job>.out`` in the run's directory, and
the launch inside the job keeps its own record under ``<run dir>/batch/runs``
(its coordinator, reachable while the job runs, gives the nodes' states) and
writes ``result.json`` as it ends (:mod:`tlaunch.runtime.results`: the one format of every
detached job, which the job's entry point writes).
Both are read here when that directory is on a filesystem the nodes share.

A job id is SLURM's, and SLURM reuses ids: the record keeps the job's name and
submit time, and a job of that id with another name or submit time is not
this run's (it ended long ago): it is never cancelled in this run's name.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tlaunch.backends.handle import Failure, LogLine, NodeStatus, RunSnapshot, RunState
from tlaunch.backends.observed import Scheduled
from tlaunch.backends.recorded import RecordedRun
from tlaunch.backends.runstates import stop_kind_of
from tlaunch.backends.slurm.commands import JobState, job_state, run_slurm
from tlaunch.errors import BatchJobError, LaunchError, StopError, failure_from_report
from tlaunch.runtime.records import RunRecord, list_records, mark_ended, read_record
from tlaunch.runtime.results import JobResult, read_result

__all__ = ["SlurmJob"]

_FAILED = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")


class SlurmJob(Scheduled):
    """A program submitted as a SLURM batch job (see the module docstring).

    Attributes:
        job_id: SLURM's job id.
        run_id: tlaunch's id of the submission (``tlaunch ps/logs/stop`` take it).
        run_dir: where its script, output and result are.
        script: the batch script as submitted.
        output: the job's output file (``slurm-<id>.out``).
        job_name: its ``--job-name`` (None: not recorded; no check against a reused id).
        submitted: SLURM's submit time of it (None: not recorded).
    """

    backend = "slurm"

    def __init__(
        self,
        job_id: str,
        run_id: str,
        run_dir: str,
        env: Mapping[str, str] | None = None,
        job_name: str | None = None,
        submitted: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.run_id = run_id
        self.run_dir = run_dir
        self.script = os.path.join(run_dir, "job.sbatch")
        self.output = os.path.join(run_dir, f"slurm-{job_id}.out")
        self.job_name = job_name
        self.submitted = submitted
        self._env = env

    @classmethod
    def from_record(cls, run_dir: str, record: RunRecord) -> SlurmJob:
        """The job of a submission's record."""
        assert record.slurm_job is not None
        name, submitted = record.refs.get("job_name"), record.refs.get("submitted")
        return cls(record.slurm_job, record.run_id, run_dir, None, name, submitted)

    def __repr__(self) -> str:
        return f"SlurmJob({self.job_id}, run {self.run_id})"

    # -- SLURM's view -----------------------------------------------------
    def state(self) -> JobState:
        """Its state now (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ``CANCELLED``...).

        ``UNKNOWN`` once the controller forgot it, or once its id belongs to another job.
        """
        state = job_state(self.job_id, self._env)
        if (self.job_name and state.name and state.name != self.job_name) or (
            self.submitted and state.submitted and state.submitted != self.submitted
        ):
            return JobState(self.job_id, "UNKNOWN", reason=f"job id {self.job_id} now belongs to another job")
        return state

    def results(self) -> JobResult | None:
        """How the job ended, as its entry point wrote it in the run's folder (a shared filesystem)."""
        return read_result(self.run_dir)

    @property
    def result(self) -> dict[str, Any] | None:
        """:meth:`results` as a plain dict (``state``, ``failure``, ``run_id``...), once it is written."""
        result = self.results()
        return None if result is None else dict(json.loads(result.to_json()))

    def read_output(self) -> str:
        """Its output so far (every node's lines, prefixed with the node)."""
        try:
            with open(self.output, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def cancel(self) -> None:
        """``scancel`` the job (only while its id is still this job's): its nodes stop, it ends CANCELLED."""
        argv = ["scancel", *([f"--name={self.job_name}"] if self.job_name else []), self.job_id]
        if not self.state().ended and self.state().state != "UNKNOWN":
            run_slurm(argv, self._env)

    def wait_running(self, timeout: float | None = None, poll: float = 0.2) -> JobState:
        """Wait until it has left PENDING; its state then.

        Raises:
            TimeoutError: still pending after ``timeout`` s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.state()
            if state.state != "PENDING":
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"SLURM job {self.job_id} is still PENDING ({state.reason}) after {timeout} s"
                )
            time.sleep(poll)

    def wait(self, timeout: float | None = None, poll: float = 0.5) -> JobState:
        """Wait until it has ended; its final state (``COMPLETED``, or ``CANCELLED`` when cancelled).

        Raises:
            RunFailedError: a node of the program failed (its own traceback; also of
                the node's exception type where Python allows).
            BatchJobError: the job ended otherwise badly (``TIMEOUT``, ``NODE_FAIL``,
                a script that could not start...), with the end of its output.
            TimeoutError: it had not ended after ``timeout`` s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.state()
            if state.ended or state.state == "UNKNOWN":
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"SLURM job {self.job_id} is still {state.state} after {timeout} s")
            time.sleep(poll)
        result = self._final_result(state)
        failure = result.failure if result is not None else None
        if failure:
            raise failure_from_report(failure)
        if state.state in ("COMPLETED", "CANCELLED"):
            return state
        if state.state == "UNKNOWN" and result is not None and result.state == "completed":
            return JobState(self.job_id, "COMPLETED", 0)
        tail = "\n".join(self.read_output().splitlines()[-30:])
        raise BatchJobError(self.job_id, state.state, state.exit_code, state.reason or "", tail)

    def _final_result(self, state: JobState) -> JobResult | None:
        result = self.results()
        if result is None and state.ended:  # SLURM reports the end before the output lands
            time.sleep(0.5)
            result = self.results()
        return result

    # -- RunHandle ----------------------------------------------------------
    def _inner(self) -> RecordedRun | None:
        """The launch inside the job, once it has written its record (the folder is shared)."""
        records = list_records(os.path.join(self.run_dir, "batch", "runs"))
        return RecordedRun(*records[0]) if records else None

    def _record_now(self) -> RunRecord | None:
        try:
            return read_record(self.run_dir)
        except (OSError, ValueError):
            return None

    def _asked(self, record: RunRecord | None) -> RunSnapshot:
        """The job as SLURM says now, its nodes' from the launch inside it; its end recorded once seen."""
        try:
            state = self.state()
        except LaunchError as exc:  # scontrol cannot be asked (no SLURM here now)
            return self._make(RunState.LOST, reason=f"SLURM cannot be asked about job {self.job_id}: {exc}")
        inner = self._inner()
        if not state.ended and state.state != "UNKNOWN":
            nodes: tuple[NodeStatus, ...] = ()
            if inner is not None and state.state == "RUNNING":
                nodes = inner.snapshot().nodes
            run_state = {"PENDING": RunState.PENDING, "COMPLETING": RunState.STOPPING}.get(
                state.state, RunState.RUNNING
            )
            why = f"SLURM job {self.job_id} is {state.state}" + (f": {state.reason}" if state.reason else "")
            return self._make(run_state, nodes, reason=why)
        result = self._final_result(state)
        said = result.state if result is not None else None
        ended = state.state if state.state != "UNKNOWN" else str(said or "UNKNOWN").upper()
        reason = f"SLURM job {self.job_id} ended {ended}"
        if result is not None and result.stop_reason:
            reason += f" ({result.stop_reason})"
        failure = result.failure if result is not None else None
        by_slurm = {"COMPLETED": "completed", "CANCELLED": "requested"}.get(ended, "failed")
        kind = {"completed": "completed", "cancelled": "requested", "failed": "failed"}.get(
            str(said),
            by_slurm,  # a job that wrote no result (its entry point never ran): SLURM's word
        )
        if not failure and (ended in _FAILED or (ended == "UNKNOWN" and result is None)):
            failure = {"key": f"SLURM job {self.job_id}", "reason": reason, "exit_code": state.exit_code}
        final = {
            "status": inner.record.final_status if inner is not None else None,
            "stop_reason": reason,
            "stop_kind": kind,
            "failure": failure,
        }
        if record is not None:
            mark_ended(self.run_dir, record, final)
            return self._recorded(record)
        return self._make(RunState.FAILED if failure else RunState.SUCCEEDED, reason=reason)

    def _recorded(self, record: RunRecord) -> RunSnapshot:
        nodes = tuple(NodeStatus.from_record(r) for r in (record.final_status or {}).values())
        failure = Failure.from_report(record.failure) if record.failure else None
        if failure is not None:
            state = RunState.FAILED
        else:
            state = RunState.STOPPED if stop_kind_of(record) == "requested" else RunState.SUCCEEDED
        return self._make(state, nodes, record.stop_reason, failure, record.created, record.program)

    def _make(
        self,
        state: RunState,
        nodes: tuple[NodeStatus, ...] = (),
        reason: str | None = None,
        failure: Failure | None = None,
        created: float | None = None,
        program: str = "",
    ) -> RunSnapshot:
        refs = {"slurm_job": self.job_id, "log_dir": self.run_dir, "output": self.output}
        if self.job_name:
            refs["job_name"] = self.job_name
        return RunSnapshot(
            self.run_id,
            "slurm",
            program or (self.job_name or ""),
            state,
            nodes,
            reason,
            failure,
            tuple(sorted({n.host for n in nodes})),
            created,
            refs,
        )

    def logs(self, node: str | None = None, *, follow: bool = False) -> Iterator[LogLine]:
        """The job's output lines (only node ``node``'s, if given); with ``follow``, until the job ends.

        Lines a node printed carry its ``[label/i]`` prefix in the output; they come
        back with the node as :attr:`LogLine.node` and the prefix removed.
        """
        offset, pending = 0, b""
        while True:
            last = not follow or self.state().ended or self.state().state == "UNKNOWN"
            if last and follow:
                time.sleep(0.3)  # SLURM may flush the last lines after the end
            try:
                with open(self.output, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                data = b""
            offset += len(data)
            *lines, pending = (pending + data).split(b"\n")
            if last and pending:
                lines, pending = [*lines, pending], b""
            for raw in lines:
                line = _line(raw.decode("utf-8", "replace"))
                if node is None or line.node == node:
                    yield line
            if last:
                return
            time.sleep(0.3)

    def log_follower(self, node: str | None = None) -> _OutputFollower:
        """The job's output (node ``node``'s lines only) to follow step by step, from its start."""
        return _OutputFollower(self.output, node)

    def stop(self, timeout: float = 60.0) -> None:
        """``scancel`` the job and wait until SLURM says it has ended (the end is recorded).

        Raises:
            StopError: it has not ended after ``timeout`` s.
        """
        self.cancel()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state()
            if state.ended or state.state == "UNKNOWN":
                self.snapshot()
                return
            time.sleep(0.2)
        raise StopError(self.run_id, {f"SLURM job {self.job_id}": [self.state().state]})

    def attach_argv(self, node: str | None = None) -> list[str]:
        """Refused: a batch job's nodes have no terminal to attach to.

        Raises:
            LaunchError: always.
        """
        raise LaunchError(
            f"run {self.run_id} is SLURM batch job {self.job_id}: it has no terminal to attach to; "
            f"follow it with `tlaunch logs -f {self.run_id}`"
        )


class _OutputFollower:
    """A batch job's output followed step by step (:class:`~tlaunch.backends.logfiles.LogSteps`)."""

    def __init__(self, path: str, node: str | None) -> None:
        self.path, self.node = path, node
        self.offset, self.pending = 0, b""

    def read(self, last: bool = False) -> list[LogLine]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        self.offset += len(data)
        *lines, self.pending = (self.pending + data).split(b"\n")
        if last and self.pending:
            lines, self.pending = [*lines, self.pending], b""
        found = (_line(raw.decode("utf-8", "replace")) for raw in lines)
        return [line for line in found if self.node is None or line.node == self.node]

    def relist_due(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _line(text: str) -> LogLine:
    """A line of the job's output, with the node of its ``[label/i]`` prefix."""
    if text.startswith("[") and "] " in text:
        prefix, rest = text[1:].split("] ", 1)
        if "/" in prefix and " " not in prefix:
            return LogLine(prefix, rest, label=prefix)
    return LogLine("", text)
