"""The run store: every run this machine's records know, found by id and attached through its backend.

Each run launched here (or submitted from here) keeps a record in
``<home>/runs/<run id>/run.json`` (``home``: ``$TLAUNCH_HOME``, else
``~/.tlaunch``). :func:`attach` turns a record into the :class:`RunHandle`
of the backend that ran it (the backend registry gives the class; each
backend's own module knows how to find its runs again).
"""

from __future__ import annotations

import os

from tlaunch.backends import get_backend
from tlaunch.backends.handle import RunHandle
from tlaunch.errors import LaunchError, RunNotFoundError
from tlaunch.runtime.records import RunRecord, list_records, read_record, runs_dir

__all__ = ["attach", "find_record", "find_run", "list_runs", "runs_dir"]


def attach(run_dir: str, record: RunRecord) -> RunHandle:
    """The handle of the run recorded in ``run_dir``, from its backend.

    Raises:
        LaunchError: no backend of that name is known here, or its runs cannot be found again.
    """
    try:
        kind = get_backend(record.backend)
    except KeyError:
        raise LaunchError(
            f"run {record.run_id} ran with launch_type {record.backend!r}, which no backend of this "
            "tlaunch serves; use the tlaunch (or the plug-in backend) that launched it"
        ) from None
    return kind.attach(run_dir, record)


def list_runs(home: str | None = None) -> list[RunHandle]:
    """Every run of the store (``home``: a ``TLAUNCH_HOME`` folder), newest first.

    Records of backends this tlaunch does not know are left out.
    """
    handles = []
    for run_dir, record in list_records(runs_dir(home)):
        try:
            handles.append(attach(run_dir, record))
        except LaunchError:
            continue
    return handles


def find_record(run: str, home: str | None = None) -> tuple[str, RunRecord]:
    """The directory and record of the run whose id is, or starts with, ``run``.

    Raises:
        RunNotFoundError: no run, or several, match (the message lists them).
    """
    run_dir = os.path.join(runs_dir(home), run)
    if os.sep not in run and run not in (".", ".."):  # its own folder: no need to read every record
        try:
            record = read_record(run_dir)
        except (OSError, ValueError):
            pass
        else:
            if record.run_id == run:
                return run_dir, record
    records = list_records(runs_dir(home))
    exact = [r for r in records if r[1].run_id == run]
    matches = exact or [r for r in records if r[1].run_id.startswith(run)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        known = ", ".join(r.run_id for _, r in records[:10]) or "none"
        raise RunNotFoundError(f"no run {run!r} in {runs_dir(home)}; known runs: {known}")
    raise RunNotFoundError(
        f"{run!r} matches several runs: {', '.join(r.run_id for _, r in matches)}; give more of its id"
    )


def find_run(run: str, home: str | None = None) -> RunHandle:
    """The run whose id is, or starts with, ``run``, ready to follow, stop or wait for.

    Raises:
        RunNotFoundError: no run, or several, match (the message lists them).
        LaunchError: its backend is not known here.
    """
    return attach(*find_record(run, home))
