"""What a run looks like from outside, whatever backend runs it: :class:`RunHandle` and its values.

Every kind of run answers the same questions the same way: the launcher's own
:class:`~tlaunch.run.Run`, a run found again from its record by another
process (``tlaunch ps``, the job server), a program submitted to SLURM
(:class:`~tlaunch.backends.slurm.SlurmJob`), an LPJob on Kubernetes::

    handle.snapshot()            -> RunSnapshot: state, nodes, failure, references
    handle.logs(node, follow=)   -> Iterator[LogLine], ending when the run ends (follow)
    handle.stop()                -> ends every process of the run (idempotent)
    handle.join(timeout)         -> RunSnapshot once it has ended; the root cause's error if it
                                    failed, TimeoutError on timeout: one contract, whatever the
                                    backend and wherever the handle came from (launch(), find_run())
    handle.results()             -> JobResult | None: how a detached job ended, as its entry point
                                    wrote it (state, root cause, what it returned)

Each backend's module holds an ``attach(run_dir, record) -> RunHandle`` that
finds one of its runs again (:mod:`tlaunch.control` calls it through the
backend registry). The values here are plain frozen dataclasses: they pickle,
they turn into JSON (:meth:`RunSnapshot.to_dict`), and they print nothing.

States::

    PENDING ──▶ RUNNING ──▶ STOPPING ──▶ SUCCEEDED | FAILED | STOPPED
                  │  ▲                          (terminal)
                  ▼  │
               RESTARTING                  LOST: cannot be followed any more
                                                (terminal; the reason says why)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tlaunch.errors import RunFailedError, failure_from_report
from tlaunch.runtime.debugger.pause import Pause
from tlaunch.runtime.results import JobResult

__all__ = [
    "Attachable",
    "Failure",
    "JobResult",
    "LogLine",
    "NodeStatus",
    "RunHandle",
    "RunSnapshot",
    "RunState",
    "ended_state",
]


class RunState(str, enum.Enum):
    """Where a run is in its life (see the module docstring for the transitions)."""

    PENDING = "PENDING"
    """Accepted, not running yet (a SLURM job in the queue, pods being scheduled)."""
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    """A node (or pod) failed and is being restarted under the run's restart policy."""
    STOPPING = "STOPPING"
    """Asked to stop (or its nodes finished); its processes are ending."""
    SUCCEEDED = "SUCCEEDED"
    """Every node finished, or the program stopped itself (``lp.stop()`` in a node)."""
    FAILED = "FAILED"
    """A node failed (see :attr:`RunSnapshot.failure`), or the job ended badly."""
    STOPPED = "STOPPED"
    """Stopped from outside: ``stop()``, ``tlaunch stop``, Ctrl-C, ``scancel``, a deleted LPJob."""
    LOST = "LOST"
    """It can no longer be followed (its launcher and coordinator are gone); the reason says why."""

    @property
    def ended(self) -> bool:
        """Whether this state is terminal."""
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.LOST})

STOP_KINDS = ("completed", "requested", "failed")
"""Why a coordinator began its stop: the program ended itself, someone stopped it, a node failed."""


def ended_state(failure: object, stop_kind: str | None) -> RunState:
    """The terminal state of a run that ended with ``failure`` (or None) after a ``stop_kind`` stop."""
    if failure or stop_kind == "failed":  # failed: the program's own outcome (a torch job's rank)
        return RunState.FAILED
    if stop_kind == "requested":
        return RunState.STOPPED
    return RunState.SUCCEEDED


@dataclass(frozen=True)
class NodeStatus:
    """One node of a run (or a pod of an LPJob, a rank of a torch job) as last seen.

    Attributes:
        key: ``label/index`` (a pod's name on Kubernetes).
        host: where it runs (a host, a SLURM node, a pod).
        state: the node's own state: ``pending``, ``starting``, ``running``,
            ``serving``, ``restarting``, ``done``, ``failed``, ``stopped``.
        pid: its process id on its host, once started.
        exit_code: its exit code, once ended.
        reason: why it ended, when it did not simply return.
        restarts: how often it was restarted.
        started_at: when it (last) started, seconds since the epoch.
        finished_at: when it ended.
        paused: where it waits in a debugger (``tlaunch debug``), if it does.
    """

    key: str
    host: str
    state: str
    pid: int | None = None
    exit_code: int | None = None
    reason: str | None = None
    restarts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    paused: Pause | None = None

    @property
    def label(self) -> str:
        """Its group label (``producer`` of ``producer/3``)."""
        return self.key.rpartition("/")[0] or self.key

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> NodeStatus:
        """From a coordinator's node record (a plain dict: ``key``, ``host``, ``state``...)."""
        return cls(
            key=str(record["key"]),
            host=str(record.get("host") or ""),
            state=str(record.get("state") or "pending"),
            pid=record.get("pid"),
            exit_code=record.get("exit_code"),
            reason=record.get("reason"),
            restarts=int(record.get("restarts") or 0),
            started_at=record.get("started_at"),
            finished_at=record.get("finished_at"),
            paused=Pause.from_record(record.get("paused")),
        )


@dataclass(frozen=True)
class Failure:
    """The root cause of a failed run: the first node (or rank, or pod) to fail.

    Attributes:
        node: its key (``learner/0``), rank or pod.
        host: where it ran.
        exit_code: its exit code, if it exited.
        reason: what tlaunch saw (``exited with code 1``, ``killed by SIGKILL``...).
        traceback: its own traceback, when it raised.
    """

    node: str
    host: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    traceback: str | None = None

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> Failure:
        """From a coordinator's failure record (``key``, ``host``, ``exit_code``, ``reason``...)."""
        return cls(
            node=str(report.get("key") or report.get("node") or "?"),
            host=report.get("host"),
            exit_code=report.get("exit_code"),
            reason=report.get("reason"),
            traceback=report.get("traceback"),
        )

    @property
    def exception(self) -> str | None:
        """Its exception's line (``ValueError: bad input``), if it raised; else its output's last line.

        ``traceback`` is the node's own traceback, or the last lines of its output
        (a command's: ``restarts.supervise``), where a Python traceback may be
        followed by more lines (``tlaunch: ... exited with code 1``): the line
        that ends the last traceback is the exception's.
        """
        lines = [line for line in (self.traceback or "").strip().splitlines() if line.strip()]
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        if starts:
            after = [line for line in lines[starts[-1] + 1 :] if not line[:1].isspace()]
            if after:
                return after[0].strip()
        return lines[-1].strip() if lines else None

    def error(self) -> RunFailedError:
        """The :class:`RunFailedError` to raise for it (also of the node's built-in exception type)."""
        return failure_from_report(
            {
                "key": self.node,
                "host": self.host,
                "exit_code": self.exit_code,
                "reason": self.reason,
                "traceback": self.traceback,
            }
        )


@dataclass(frozen=True)
class RunSnapshot:
    """A run, as it is now.

    Attributes:
        run_id: tlaunch's id of the run.
        backend: the backend that runs it (its launch type: ``local_mp``, ``ssh``...).
        program: the program's (or job's) name.
        state: where it is in its life.
        nodes: every node (pod, rank) with its own state, in program order.
        reason: why it stopped, why it is pending or lost (None while it simply runs).
        failure: the root cause, when it failed.
        hosts: the hosts it runs on.
        created: when it was launched, seconds since the epoch.
        refs: the backend's own names for it (``slurm_job``, ``lpjob``,
            ``namespace``, ``head``, ``log_dir``...).
    """

    run_id: str
    backend: str
    program: str
    state: RunState
    nodes: tuple[NodeStatus, ...] = ()
    reason: str | None = None
    failure: Failure | None = None
    hosts: tuple[str, ...] = ()
    created: float | None = None
    refs: Mapping[str, str] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        """Whether the run has ended."""
        return self.state.ended

    def node(self, key: str) -> NodeStatus:
        """The node ``key``.

        Raises:
            KeyError: the run has no such node (the message lists its nodes).
        """
        for n in self.nodes:
            if n.key == key:
                return n
        raise KeyError(f"run {self.run_id} has no node {key!r}; its nodes: {[n.key for n in self.nodes]}")

    def to_dict(self) -> dict[str, Any]:
        """As plain JSON-able values (the state as its name)."""
        out = dataclasses.asdict(self)
        out["state"] = self.state.value
        out["refs"] = dict(self.refs)
        return out


@dataclass(frozen=True)
class LogLine:
    """One line of a run's output.

    Attributes:
        node: whose line it is: a node's key (``producer/0``), a pod, a rank (``th1[0]``),
            or ``""`` where the backend cannot tell.
        text: the line, without its newline.
        host: where it was written, when known.
        label: how the backend labels the line where it shows it (``th1 talker_0``,
            the name of the node's log file on its host); None: host and node.
    """

    node: str
    text: str
    host: str | None = None
    label: str | None = None

    @property
    def where(self) -> str:
        """What the line is shown prefixed with: its label, else host and node ("" if unknown)."""
        if self.label is not None:
            return self.label
        return f"{self.host} {self.node}" if self.host and self.node else self.node or self.host or ""

    def __str__(self) -> str:
        return f"[{self.where}] {self.text}" if self.where else self.text


@runtime_checkable
class RunHandle(Protocol):
    """A run, whatever started it and wherever it runs (see the module docstring)."""

    @property
    def run_id(self) -> str:
        """tlaunch's id of the run."""

    @property
    def backend(self) -> str:
        """The backend's name (``local_mp``, ``ssh``, ``slurm``, ``k8s``...)."""

    def snapshot(self) -> RunSnapshot:
        """Its state now, with every node's, the root cause and the backend's references."""

    def logs(self, node: str | None = None, *, follow: bool = False) -> Iterator[LogLine]:
        """Its output so far (only node ``node``'s, if given); with ``follow``, until the run ends.

        Raises:
            KeyError: the run has no node ``node``.
        """

    def stop(self) -> None:
        """Stop every process of the run and confirm none is left; idempotent.

        Raises:
            StopError: something of the run outlived its kill.
        """

    def results(self) -> JobResult | None:
        """How the run's job ended, as its entry point wrote it (the one format of every detached
        job: state, root cause, what it returned); None for a run that was no such job, or one that
        has not ended."""

    def join(self, timeout: float | None = None) -> RunSnapshot:
        """Block until the run has ended; its final snapshot.

        Raises:
            RunFailedError: it failed: its root cause's error (the failing node, rank or pod, its
                host and traceback; also of the node's built-in exception type where it names one).
            TimeoutError: it had not ended after ``timeout`` s (it goes on).
        """


@runtime_checkable
class Attachable(Protocol):
    """A run whose nodes have terminals one can open here (tmux windows): ``tlaunch attach``."""

    def attach_argv(self, node: str | None = None) -> list[str]:
        """The command that opens node ``node``'s terminal (the run's own, if None) in this terminal.

        Raises:
            LaunchError: the run (or that node) has no terminal to open now.
        """
