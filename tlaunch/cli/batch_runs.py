"""``tlaunch ps``, ``logs`` and ``stop`` on a program submitted as a SLURM batch job.

Such a run has no coordinator on the submitting machine: SLURM knows its state
(``scontrol``), its output is ``slurm-<job>.out`` in the run's directory, and
the launch inside the job keeps its own record under ``<run dir>/batch/runs``
(its coordinator, reachable while the job runs, gives the nodes' states).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from tlaunch.backends.slurm.commands import JobState, job_state, run_slurm
from tlaunch.cli.records import coordinator_client, mark_ended
from tlaunch.errors import LaunchError, RPCError
from tlaunch.runtime.records import RunRecord, list_records

__all__ = ["batch_logs", "batch_status", "batch_stop", "is_batch"]


def is_batch(record: RunRecord) -> bool:
    """Whether ``record`` is a submitted batch job (no coordinator of its own here)."""
    return bool(record.slurm_job) and not record.coordinator


def _inner(run_dir: str) -> tuple[str, RunRecord] | None:
    """The record the launch inside the job wrote, if it has started (and the folder is shared)."""
    records = list_records(os.path.join(run_dir, "batch", "runs"))
    return records[0] if records else None


def _result(run_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(run_dir, "result.json")) as f:
            return dict(json.load(f))
    except (OSError, ValueError):
        return {}


def batch_status(run_dir: str, record: RunRecord) -> tuple[str, dict[str, Any] | None]:
    """Its state (``pending``, ``running``, ``ended``...) and, where known, its nodes' states."""
    assert record.slurm_job is not None
    try:
        state = job_state(record.slurm_job)
    except LaunchError as exc:
        return f"unknown ({exc})", None
    inner = _inner(run_dir)
    if not state.ended and state.state != "UNKNOWN":
        status = None
        if inner is not None and state.state == "RUNNING" and not inner[1].ended:
            client = coordinator_client(*inner)
            try:
                status = client.status()
            except (RPCError, OSError):
                status = None
            finally:
                client.close()
        why = f": {state.reason}" if state.reason else ""
        return f"{state.state.lower()} (SLURM job {record.slurm_job}{why})", status
    _record_end(run_dir, record, state, inner)
    return "ended", record.final_status


def _record_end(
    run_dir: str, record: RunRecord, state: JobState, inner: tuple[str, RunRecord] | None
) -> None:
    result = _result(run_dir)
    ended = state.state if state.state != "UNKNOWN" else str(result.get("state", "UNKNOWN")).upper()
    reason = f"SLURM job {record.slurm_job} ended {ended}"
    if result.get("stop_reason"):
        reason += f" ({result['stop_reason']})"
    final = {
        "status": inner[1].final_status if inner is not None else None,
        "stop_reason": reason,
        "failure": result.get("failure"),
    }
    mark_ended(run_dir, record, final)


def batch_stop(run_dir: str, record: RunRecord, timeout: float) -> int:
    """``scancel`` the job and wait until SLURM says it has ended."""
    assert record.slurm_job is not None
    try:
        run_slurm(["scancel", record.slurm_job])
    except LaunchError as exc:
        print(f"tlaunch: {exc}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_state(record.slurm_job)
        if state.ended or state.state == "UNKNOWN":
            _record_end(run_dir, record, state, _inner(run_dir))
            print(f"run {record.run_id} stopped (SLURM job {record.slurm_job} {state.state})")
            return 0
        time.sleep(0.2)
    job = record.slurm_job
    print(f"run {record.run_id}: SLURM job {job} was cancelled but has not ended after {timeout:.0f} s")
    return 1


def batch_logs(run_dir: str, record: RunRecord, node: str | None, follow: bool) -> int:
    """Print the job's output (only node ``node``'s lines, if given); with ``follow``, until it ends."""
    assert record.slurm_job is not None
    path = os.path.join(run_dir, f"slurm-{record.slurm_job}.out")
    offset, pending = 0, b""
    while True:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        *lines, pending = (pending + data).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if node is None or line.startswith(f"[{node}]"):
                sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if not follow:
            break
        state = job_state(record.slurm_job)
        if state.ended or state.state == "UNKNOWN":
            follow = False  # one more read: SLURM may flush the last lines after the end
            time.sleep(0.3)
            continue
        time.sleep(0.3)
    if pending and (node is None or pending.startswith(f"[{node}]".encode())):
        sys.stdout.write(pending.decode("utf-8", "replace") + "\n")
    if offset == 0 and not os.path.exists(path):
        print(
            f"tlaunch: no output of SLURM job {record.slurm_job} at {path} yet (it is written there by "
            "the job's first node: on a filesystem this machine shares with the nodes)",
            file=sys.stderr,
        )
    return 0
