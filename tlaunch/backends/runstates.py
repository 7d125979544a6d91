"""A run's state, told from what is known of it (pure): its nodes while it runs, its record once ended.

Every handle answers with these rules: the launcher's own :class:`~tlaunch.run.Run`
(:func:`live_state`), a run found again from its record
(:class:`~tlaunch.backends.recorded.RecordedRun`), an LPJob's and a SLURM job's
recorded end (:func:`ended_from`, :func:`stop_kind_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlaunch.backends.handle import Failure, NodeStatus, RunState, ended_state
from tlaunch.runtime.records import RunRecord
from tlaunch.runtime.states import COMPLETED, REQUESTED, RESTARTING

__all__ = ["Ended", "ended_from", "live_state", "stop_kind_of"]


def live_state(nodes: list[NodeStatus], *, stopping: bool) -> RunState:
    """The state of a run that has not ended, from its nodes' states."""
    if stopping:
        return RunState.STOPPING
    if any(n.state == RESTARTING for n in nodes):
        return RunState.RESTARTING
    if nodes and all(n.state == "pending" for n in nodes):
        return RunState.PENDING
    return RunState.RUNNING


def stop_kind_of(record: RunRecord) -> str | None:
    """Why the run's stop began; for records written before tlaunch kept it, told from the reason."""
    if record.stop_kind or not record.stop_reason:
        return record.stop_kind
    reason = record.stop_reason
    if reason.startswith("every node") or (
        reason.startswith("stop() was called by ") and not reason.endswith("the launcher")
    ):
        return COMPLETED
    return REQUESTED


@dataclass(frozen=True)
class Ended:
    """How a run ended, as its record says.

    Attributes:
        state: its terminal state (``LOST`` where the record says it was lost).
        nodes: its nodes' final states.
        failure: its root cause, if it failed.
        reason: why it ended (why it was lost, or why its stop began).
    """

    state: RunState
    nodes: tuple[NodeStatus, ...]
    failure: Failure | None
    reason: str | None


def ended_from(record: RunRecord) -> Ended:
    """How the run of an ended ``record`` ended."""
    nodes = tuple(NodeStatus.from_record(r) for r in (record.final_status or {}).values())
    state = RunState.LOST if record.lost else ended_state(record.failure, stop_kind_of(record))
    failure = Failure.from_report(record.failure) if record.failure else None
    return Ended(state, nodes, failure, record.lost or record.stop_reason)
