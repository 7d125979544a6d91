"""What a distributed PyTorch launch raises when it fails.

A worker that raises has its own exception raised in the launcher (same type,
the remote traceback attached as ``remote_traceback`` and printed); the
classes here cover everything else::

    TLaunchError
    └── TorchLaunchError           a torch launch failed
        ├── WorkerFailedError      a worker died without raising (signal, OOM kill, os._exit)
        ├── AgentFailedError       a host's agent died or its host was lost
        ├── WorkerRaisedError      a worker raised an exception the launcher cannot unpickle
        └── JobFailedError         a torchrun / deepspeed / basic job ended with a failure
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tlaunch.errors import Fields, TLaunchError

__all__ = [
    "AgentFailedError",
    "JobFailedError",
    "TorchLaunchError",
    "WorkerFailedError",
    "WorkerRaisedError",
    "failure_report",
]


def _where(host: str, rank: int | None, local_rank: int | None) -> str:
    if rank is None:
        return f"host {host!r}"
    return f"rank {rank} (host {host!r}, local rank {local_rank})"


class TorchLaunchError(TLaunchError):
    """A distributed PyTorch launch failed."""


@dataclasses.dataclass(eq=False, repr=False)
class WorkerFailedError(Fields, TorchLaunchError):
    """A worker died without raising: killed by a signal (OOM, SIGKILL), or exited with a code.

    Attributes:
        host: the worker's host.
        rank: its global rank.
        local_rank: its rank on its host.
        exit_code: its exit code (negative: the signal that killed it).
        log_tail: the last lines of its output.
    """

    host: str
    rank: int
    local_rank: int
    exit_code: int
    log_tail: str = ""

    def __post_init__(self) -> None:
        code = self.exit_code
        if code < 0:
            import signal

            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code} without raising"
        msg = f"worker {_where(self.host, self.rank, self.local_rank)} {how}"
        if self.log_tail.strip():
            msg += f"; the last lines of its output:\n{self.log_tail.rstrip()}"
        super().__init__(msg)


@dataclasses.dataclass(eq=False, repr=False)
class AgentFailedError(Fields, TorchLaunchError):
    """A host's agent died, or its host stopped answering.

    Attributes:
        host: the host.
        reason: what tlaunch saw.
    """

    host: str
    reason: str

    def __post_init__(self) -> None:
        super().__init__(f"the agent on host {self.host!r} failed: {self.reason}")


@dataclasses.dataclass(eq=False, repr=False)
class WorkerRaisedError(Fields, TorchLaunchError):
    """A worker raised an exception that cannot be rebuilt in the launcher.

    Attributes:
        host, rank, local_rank: where it was raised.
        type_name: the exception's qualified type name.
        message: ``str()`` of the exception.
        remote_traceback: its traceback, as text.
    """

    host: str
    rank: int
    local_rank: int
    type_name: str
    message: str
    remote_traceback: str

    def __post_init__(self) -> None:
        where = _where(self.host, self.rank, self.local_rank)
        super().__init__(
            f"worker {where} raised {self.type_name}: {self.message}\n"
            f"its traceback:\n{self.remote_traceback.rstrip()}"
        )


@dataclasses.dataclass(eq=False, repr=False)
class JobFailedError(Fields, TorchLaunchError):
    """A torchrun, deepspeed or basic job failed.

    Attributes:
        host: the host of the root cause.
        rank: the failing rank (None when a whole host failed).
        exit_code: its exit code, if known.
        remote_traceback: the failing rank's traceback, if it raised.
        reason: what failed, in words.
        log_tail: the last lines of the failing rank's output, when it exited without a
            traceback to show (``os._exit``, a signal, ``sys.exit``).
    """

    host: str
    rank: int | None
    exit_code: int | None
    remote_traceback: str | None
    reason: str
    log_tail: str = ""

    def __post_init__(self) -> None:
        host, rank = self.host, self.rank
        where = f"rank {rank} on host {host!r}" if rank is not None else f"host {host!r}"
        msg = f"{where}: {self.reason}"
        if self.remote_traceback:
            msg += f"\nits traceback:\n{self.remote_traceback.rstrip()}"
        if self.log_tail.strip():
            msg += f"\nthe last lines of its output:\n{self.log_tail.rstrip()}"
        super().__init__(msg)


def failure_report(exc: BaseException) -> dict[str, Any]:
    """The run's failure record (``Failure.from_report`` reads it) of a torch job that failed with ``exc``.

    The root cause is a rank (``rank N``) on its host, with its exit code and traceback
    when known; a worker's own exception (function launch) keeps its remote traceback.
    """
    if isinstance(exc, JobFailedError | WorkerFailedError | WorkerRaisedError):
        report: dict[str, Any] = {"key": "job" if exc.rank is None else f"rank {exc.rank}", "host": exc.host}
        if isinstance(exc, JobFailedError):
            shown = exc.remote_traceback or exc.log_tail or None  # a rank that just exited: its output
            report.update(exit_code=exc.exit_code, reason=exc.reason, traceback=shown)
        elif isinstance(exc, WorkerFailedError):
            report.update(exit_code=exc.exit_code, reason=str(exc), traceback=exc.log_tail or None)
        else:
            report.update(reason=f"{exc.type_name}: {exc.message}", traceback=exc.remote_traceback)
        return report
    if isinstance(exc, AgentFailedError):
        return {"key": "agent", "host": exc.host, "reason": exc.reason}
    traceback = getattr(exc, "remote_traceback", None)  # a worker's own exception, raised here again
    return {"key": str(getattr(exc, "node", None) or "job"), "reason": f"{type(exc).__name__}: {exc}",
            "traceback": traceback}  # fmt: skip
