"""How a torch job ended, as typed records: from each host's agent, through the collector, to the launcher.

::

    agent ─ WorkerFailure (a worker or host launcher died or raised) ─┐
          ─ HostOutcome (results, or the host launcher's exit code) ──┼─▶ Collector.wait() ─▶ JobOutcome
          ─ RankError (a rank's error or exit, torchrun/deepspeed) ───┘         │
                                                          Job.outcome() adds ``lost``
                                                                                 │
                           function launch: LaunchResult / the worker's own exception
                           torchrun, deepspeed: JobResult / JobFailedError (torchrun.finish)

They travel between hosts pickled (by reference: every host has tlaunch);
results and a worker's exception stay pickled bytes until the launcher opens
them, so nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["UNREADABLE_REPORT", "HostOutcome", "JobOutcome", "RankError", "WorkerFailure"]

UNREADABLE_REPORT = "unreadable error report"
"""The :attr:`RankError.type` of a report that is not what :mod:`tlaunch.torch.record` writes."""


@dataclass(frozen=True)
class RankError:
    """A rank's error, as :mod:`tlaunch.torch.record` reported it (torchrun and deepspeed modes), or
    a rank's exit without raising, as :mod:`tlaunch.torch.elastic` reported it (torchrun mode).

    Attributes:
        time: when it was raised (the rank's clock, seconds since the epoch); for an exit, when
            the rank last wrote its output (it died after that, before its peers' errors).
        host: the rank's host (None: not known).
        rank: its global rank (None: not known).
        local_rank: its rank on its host.
        restart: the attempt it failed in (torch's restart count).
        type: the exception's type name (empty: it raised nothing; it exited with ``exit_code``).
        message: ``str()`` of the exception.
        traceback: its traceback, as text.
        exit_code: its exit code, when it exited (negative: the signal that killed it).
        output: the last lines of its output (at most 20 lines, 4 KiB), when it exited.
    """

    time: float
    host: str | None
    rank: int | None
    local_rank: int
    restart: int
    type: str
    message: str
    traceback: str
    exit_code: int | None = None
    output: str = ""

    @property
    def raised(self) -> bool:
        """Whether the rank raised (an exception, ``SystemExit`` among them) rather than just exited."""
        return bool(self.type)

    @classmethod
    def from_report(cls, report: object, time: float, source: str = "") -> RankError:
        """The error of a report as read from its file; one that says so when the report is malformed.

        Args:
            report: the report's JSON value.
            time: when it was found (used when the report has no time of its own).
            source: where it was read (named in a malformed report's message).
        """
        if isinstance(report, dict):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                error = cls(
                    time=float(report["time"]),
                    host=report.get("host"),
                    rank=report.get("rank"),
                    local_rank=int(report["local_rank"]),
                    restart=int(report["restart"]),
                    type=str(report["type"]),
                    message=str(report["message"]),
                    traceback=report.get("traceback", ""),
                    exit_code=report.get("exit_code"),
                    output=report.get("output", ""),
                )
                if (
                    math.isfinite(error.time)
                    and isinstance(error.host, (str, type(None)))
                    and (error.rank is None or type(error.rank) is int)
                    and isinstance(error.traceback, str)
                    and (error.exit_code is None or type(error.exit_code) is int)
                    and isinstance(error.output, str)
                ):
                    return error
        shown = repr(report)
        if len(shown) > 200:
            shown = shown[:200] + "..."
        where = f" ({source})" if source else ""
        host = report.get("host") if isinstance(report, dict) else None
        return cls(
            time=time,
            host=host if isinstance(host, str) else None,
            rank=None,
            local_rank=0,
            restart=0,
            type=UNREADABLE_REPORT,
            message=f"a rank left a report tlaunch cannot read{where}: {shown}",
            traceback="",
        )


@dataclass(frozen=True)
class WorkerFailure:
    """A failure an agent saw: a worker that raised or died, or a host's launcher that gave up.

    Attributes:
        host: where.
        time: when (the earliest one within the collector's window is the root cause).
        exit_code: the worker's (or host launcher's) exit code; negative: the signal that killed it.
        rank: the worker's global rank (None: a whole host's launcher failed).
        local_rank: its rank on its host.
        error: the pickled error record the worker wrote when it raised (function launch).
        log_tail: its last lines of output, when it died without raising.
    """

    host: str
    time: float
    exit_code: int | None
    rank: int | None = None
    local_rank: int | None = None
    error: bytes | None = None
    log_tail: str = ""


@dataclass(frozen=True)
class HostOutcome:
    """What one host's agent reported when its part of the job ended.

    Attributes:
        exit_code: the host launcher's exit code (torchrun, deepspeed), None otherwise.
        results: each worker's pickled result, by local rank (function launch).
        failures: the failures it saw (then the job failed).
    """

    exit_code: int | None = None
    results: tuple[bytes, ...] | None = None
    failures: tuple[WorkerFailure, ...] = ()


@dataclass(frozen=True)
class JobOutcome:
    """How the job ended, as the collector knows it (:meth:`Collector.wait`).

    Attributes:
        outcomes: each agent's outcome, by agent index (agents that reported).
        errors: every rank's error report, in the order they arrived.
        failure: the root cause, when the job failed.
        failures: every failure reported.
        lost: agents that ended without reporting (their host lost), index -> host.
    """

    outcomes: Mapping[int, HostOutcome]
    errors: tuple[RankError, ...] = ()
    failure: WorkerFailure | None = None
    failures: tuple[WorkerFailure, ...] = ()
    lost: Mapping[int, str] = field(default_factory=dict)

    def exit_codes(self, hosts: list[str]) -> dict[str, int]:
        """Each host's launcher exit code, for the agents that reported one."""
        return {hosts[i]: o.exit_code for i, o in self.outcomes.items() if o.exit_code is not None}
