"""How a detached job ended, in one format: ``result.json`` in its run's folder (:class:`JobResult`).

Every entry point that runs a job away from its submitter writes it as the job
ends, and every handle reads it back the same way (``RunHandle.results()``,
a SLURM job's final state)::

    writes                                              reads
    ─────────────────────────────────────────────────   ───────────────────────────────────────
    tlaunch.control.starting's job entry point (any     RecordedRun.results(), SlurmJob
      job: this machine, SSH hosts, a SLURM step)         (its state, root cause, results)
    the launcher's batch entry (a submitted program)    SlurmJob
    tlaunch.runtime.pyenv ensure --report (a failed
      build of a job's runtime environment: the same
      fields, written by that file alone: it runs in
      pods without tlaunch)

The file is written whole (a temporary file renamed over it), 0600. The job's
entry point writes it first as *pending* (:func:`write_pending`), before the job
starts: a run whose processes have ended while its result is pending is still
ending (its handle says ``STOPPING``), so nobody reads a job as ended before
its result is there.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["RESULT_FILE", "JobResult", "pending_result", "read_result", "write_pending", "write_result"]

_PENDING = "pending"

RESULT_FILE = "result.json"

Ended = Literal["completed", "failed", "cancelled"]


@dataclass(frozen=True)
class JobResult:
    """How a job ended.

    Attributes:
        state: ``completed``, ``failed`` or ``cancelled`` (stopped: ``scancel``, SIGTERM).
        failure: the root cause when it failed (``key``, ``host``, ``exit_code``, ``reason``,
            ``traceback``: what ``Failure.from_report`` reads).
        stop_reason: why it ended, in words.
        results: what the job returned, for a method that keeps it (JSON), else None.
        results_why: why what it returned was not kept (it was not JSON).
        run_id: the id of the run that ran it (a SLURM job's run inside the allocation).
        slurm_job: the SLURM job it ran in, if any.
        started: when its entry point started, seconds since the epoch.
        ended: when it ended.
    """

    state: Ended
    failure: dict[str, Any] | None = None
    stop_reason: str | None = None
    results: Any = None
    results_why: str | None = None
    run_id: str | None = None
    slurm_job: str | None = None
    started: float | None = None
    ended: float | None = None

    def to_json(self) -> str:
        """The file's text."""
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}, indent=1)

    def write(self, path: str) -> None:
        """Write this result at ``path``, whole (a temporary file renamed over it), 0600."""
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".result.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.to_json())
        os.replace(tmp, path)

    @classmethod
    def from_json(cls, text: str) -> JobResult:
        """A result from its file's text.

        Raises:
            ValueError: not a result.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("state") not in ("completed", "failed", "cancelled"):
            raise ValueError(f"not a job result: {text[:200]!r}")
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def write_result(folder: str, result: JobResult) -> str:
    """Write ``result`` into ``folder`` (whole, 0600); its path."""
    path = os.path.join(folder, RESULT_FILE)
    result.write(path)
    return path


def write_pending(folder: str, started: float) -> None:
    """Say in ``folder`` that a job's result is to come (its entry point runs the job)."""
    path = os.path.join(folder, RESULT_FILE)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".result.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"state": _PENDING, "started": started}, f)
    os.replace(tmp, path)


def pending_result(folder: str) -> bool:
    """Whether ``folder``'s job result is still to come (:func:`write_pending`, and nothing since)."""
    try:
        with open(os.path.join(folder, RESULT_FILE), encoding="utf-8") as f:
            return bool(json.load(f).get("state") == _PENDING)
    except (OSError, ValueError, AttributeError):
        return False


def read_result(folder: str) -> JobResult | None:
    """The result written in ``folder``; None if none is (yet)."""
    try:
        with open(os.path.join(folder, RESULT_FILE), encoding="utf-8") as f:
            return JobResult.from_json(f.read())
    except (OSError, ValueError, TypeError):
        return None
