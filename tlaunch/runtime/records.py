"""Run records: how a second process finds a run (``tlaunch ps/logs/stop``).

Each run writes ``<runs dir>/<run-id>/run.json`` (what it is, where its nodes
are, its coordinator's address) and ``run.keys`` (its secrets, mode 0600), both
in the run's 0700 directory. A process of the same user reads them to talk to
the run's coordinator; at the end the record keeps the final node states.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import time
from dataclasses import dataclass, field, fields
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.procs import pid_exists, pid_space, process_start
from tlaunch.rpc.client import RPCClient, fixed_resolver
from tlaunch.rpc.security import RunKeys
from tlaunch.runtime.private import take_file, write_private

__all__ = [
    "PREPARING_LOG",
    "RunRecord",
    "coordinator_client",
    "free_run_id",
    "launcher_alive",
    "list_records",
    "mark_ended",
    "torn_down",
    "read_record",
    "runs_dir",
    "private_dirs",
    "read_keys",
    "take_file",
    "write_private",
    "write_record",
]

PREPARING_LOG = "runtime-env"
"""The name (without ``.log``) of a run's logs of its preparation (its runtime environment's build)."""


_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass
class RunRecord:
    """What is known of a run from outside it."""

    run_id: str
    program: str
    backend: str
    coordinator: str
    launcher_pid: int | None
    created: float = field(default_factory=time.time)
    hosts: list[str] = field(default_factory=list)
    ssh_config: str | None = None
    log_dir: str | None = None
    ended: bool = False
    final_status: dict[str, Any] | None = None
    head: str | None = None
    head_pid: int | None = None
    detached: bool = False
    stop_reason: str | None = None
    failure: dict[str, Any] | None = None
    keep_bundles: bool = False
    launcher_start: int | None = None  # the launcher's start time: its pid, once reused, is not it
    # Where the launcher's pid means something (procs.pid_space); None: here (older records).
    launcher_pid_space: str | None = None
    slurm_job: str | None = None  # the SLURM job it runs in (a submitted batch job has no coordinator here)
    stop_kind: str | None = None  # why its stop began: completed, requested, failed (runtime.coordinator)
    refs: dict[str, str] = field(default_factory=dict)  # the backend's own names (job name, namespace...)
    lost: str | None = None  # why it can no longer be followed, once known
    graph: list[dict[str, Any]] = field(default_factory=list)  # LaunchPlan.graph(): nodes, groups, handles
    # What its launcher does before the run starts (builds its runtime environment): a record
    # written then has no coordinator yet; the launch's own record replaces it.
    preparing: str | None = None


def free_run_id(runs: str, run_id: str) -> str:
    """``run_id`` once checked: safe as a folder and tmux name, and no run of ``runs`` has started with it.

    A record of that id that is still *preparing* (written by the launcher
    that now launches it) does not count.

    Raises:
        LaunchError: it is not, or a run of that id has started.
    """
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise LaunchError(
            f"run_id={run_id!r} is not a valid run id: use letters, digits, '-', '_' and '.', "
            "starting with a letter or digit, at most 128 characters"
        )
    with contextlib.suppress(OSError, ValueError):
        if not read_record(os.path.join(runs, run_id)).preparing:
            raise LaunchError(f"run_id={run_id!r}: a run of that id exists in {runs}; pick another")
    return run_id


def runs_dir(home: str | None = None) -> str:
    """Where runs keep their records and logs: ``<home>/runs``.

    ``home`` defaults to ``$TLAUNCH_HOME``, else ``~/.tlaunch``.
    """
    home = home or os.environ.get("TLAUNCH_HOME") or os.path.join(os.path.expanduser("~"), ".tlaunch")
    return os.path.join(home, "runs")


def private_dirs(path: str, top: str) -> None:
    """Make ``path`` and the directories between it and ``top`` (included) that are missing, mode 0700.

    ``os.makedirs`` would give the directories above the last the umask's mode
    (0755): a runs directory tlaunch creates would list every run to every
    local user. Directories that exist keep their mode: a team's shared
    ``TLAUNCH_HOME`` (2775) stays open; each run's own directory is new, so
    always 0700.
    """
    path, top = os.path.abspath(path), os.path.abspath(top)
    if path != top:
        if not path.startswith(top.rstrip(os.sep) + os.sep):
            raise ValueError(f"{path} is not inside {top}")
        private_dirs(os.path.dirname(path), top)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)  # above the top: not tlaunch's to close
    try:
        os.mkdir(path, mode=0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)  # whatever the umask


def write_record(run_dir: str, record: RunRecord, keys: RunKeys | None = None) -> None:
    """Write (or update) the record of the run in ``run_dir``.

    Its fields hold JSON's own types, so they go as they are (``asdict`` copied them
    deeply: ~16 ms for a run of 256 nodes), on one line (``indent`` makes ``json`` use
    its Python encoder: ~3x the C one's time).
    """
    fields_ = {f.name: getattr(record, f.name) for f in fields(record)}
    write_private(os.path.join(run_dir, "run.json"), json.dumps(fields_).encode())
    if keys is not None:
        write_private(os.path.join(run_dir, "run.keys"), pickle.dumps(keys))


def read_keys(run_dir: str) -> RunKeys:
    """The keys of the run in ``run_dir``."""
    with open(os.path.join(run_dir, "run.keys"), "rb") as f:
        keys = pickle.load(f)
    if not isinstance(keys, RunKeys):
        raise TypeError(f"{run_dir}/run.keys holds no run keys")
    return keys


def read_record(run_dir: str) -> RunRecord:
    """The record in ``run_dir``.

    Raises:
        OSError: there is none.
        ValueError: it is not a run record.
    """
    with open(os.path.join(run_dir, "run.json")) as f:
        data = json.load(f)
    try:
        return RunRecord(**data)
    except TypeError as exc:  # written by a tlaunch that knew other fields
        raise ValueError(f"{run_dir}/run.json is not a run record: {exc}") from None


def list_records(runs_dir: str) -> list[tuple[str, RunRecord]]:
    """Every run record under ``runs_dir``, newest first, with its directory."""
    out: list[tuple[str, RunRecord]] = []
    if not os.path.isdir(runs_dir):
        return out
    for name in os.listdir(runs_dir):
        run_dir = os.path.join(runs_dir, name)
        try:
            out.append((run_dir, read_record(run_dir)))
        except (OSError, ValueError):
            continue
    out.sort(key=lambda item: item[1].created, reverse=True)
    return out


def mark_ended(run_dir: str, record: RunRecord, final: dict[str, Any]) -> None:
    """Record that the run has ended, and how; its keys go.

    ``final`` holds what a coordinator's summary holds (``status``, ``stop_reason``,
    ``stop_kind``, ``failure``), or why the run was ``lost``.
    """
    record.ended = True
    record.final_status = final.get("status", record.final_status)
    record.stop_reason = final.get("stop_reason")
    record.stop_kind = final.get("stop_kind")
    record.failure = final.get("failure")
    record.lost = final.get("lost")
    record.preparing = None
    write_record(run_dir, record)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run_dir, "run.keys"))


TORN_DOWN = "its end was not reported; the run's teardown ended it"


def torn_down(status: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A run's final node states once its teardown has confirmed that nothing of it is left.

    A node whose end its coordinator never heard of (it outlived the wait for the
    nodes' ends, and the teardown killed it) is ``stopped``: a run that has ended
    never shows a node serving or running.
    """
    from tlaunch.runtime.states import STOPPED, TERMINAL_STATES

    return {
        key: rec if rec.get("state") in TERMINAL_STATES else {**rec, "state": STOPPED, "reason": TORN_DOWN}
        for key, rec in status.items()
    }


def coordinator_client(run_dir: str, record: RunRecord, address: str | None = None) -> RPCClient:
    """A client of the run's coordinator; a refused connection fails at once (it is gone).

    ``address``: where to reach it, if not at the address it advertised (a forward to it).

    Raises:
        OSError: the run's keys are gone (it has ended).
    """
    return RPCClient(
        "coordinator",
        read_keys(run_dir),
        fixed_resolver(address or record.coordinator),
        resolve_timeout=3.0,
        default_timeout=5.0,
        retry_refused=False,
        shared_memory=False,  # small messages: no greeting round trip
        tls_server=True,  # as every coordinator's client (RPCServer's tls_client)
    )


def launcher_alive(record: RunRecord) -> bool | None:
    """Whether the run's launcher still runs: its pid, started when the record says (not a reused pid).

    None: nobody here can tell, as its pid belongs to another machine (a home folder that
    machines share) or container; its coordinator, asked, is what says whether the run lives.
    """
    if record.launcher_pid is None or record.detached:
        return False
    if record.launcher_pid_space not in (None, pid_space()):
        return None
    if not pid_exists(record.launcher_pid):
        return False
    return record.launcher_start is None or process_start(record.launcher_pid) == record.launcher_start
