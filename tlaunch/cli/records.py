"""What the run commands share: a run's coordinator as a client, and recording a run's end."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from tlaunch.rpc.client import RPCClient, fixed_resolver
from tlaunch.runtime.records import RunRecord, read_keys, write_record

__all__ = ["coordinator_client", "mark_ended"]


def coordinator_client(run_dir: str, record: RunRecord) -> RPCClient:
    """A client of the run's coordinator; a refused connection fails at once (it is gone)."""
    resolver = fixed_resolver(record.coordinator)
    return RPCClient(
        "coordinator",
        read_keys(run_dir),
        resolver,
        resolve_timeout=3.0,
        default_timeout=5.0,
        retry_refused=False,
    )


def mark_ended(run_dir: str, record: RunRecord, final: dict[str, Any]) -> None:
    """Record that the run has ended, with its final status; its keys go."""
    record.ended = True
    record.final_status = final.get("status", record.final_status)
    record.stop_reason = final.get("stop_reason")
    record.failure = final.get("failure")
    write_record(run_dir, record)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run_dir, "run.keys"))
