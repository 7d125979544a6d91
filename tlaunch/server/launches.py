"""The server's launches: the jobs a submit accepted, launched after the submit has been answered.

A submit answers ``201`` with the job ``PENDING`` as soon as the job is
checked and its row written; the job's launch (its copy of its package, then a
launcher process of its own, an ``sbatch``, an LPJob:
:meth:`tlaunch.server.starter.Starter.start`, which waits until the run is
recorded) happens here, ``max_starting`` at a time, oldest first. Its steps
are in the row, so a server killed at any point finds each job again when it
starts:

1. accepted (``started`` empty): it is launched (again) by the next server;
2. launching (``started`` and ``planned_run`` set, the run id the launch was
   given): a server that finds it so waits for the run to appear in its run
   store (the launcher may be starting still), up to ``timeout`` after the
   launch began; a run that appears is the job's, else the job ``FAILED``
   ("the server stopped while launching it");
3. launched (``run_id``): the watcher follows it.

Submits are answered first: a launch waits until no job has been accepted for
``quiet`` seconds (50 submits at once are answered, then launched), and at most
``settle`` seconds after its own job was accepted. A launcher is a process of
its own, starting Python: four of them starting on a 2-core machine tripled
the time 50 submits at once waited for their answers.

A launch that fails turns the job ``FAILED`` with the reason (the launcher's
own output), never a job left ``PENDING``. A job stopped or deleted while it
waits is not launched; one stopped or deleted while it was being launched is
stopped as soon as its launch returns.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable

from tlaunch import control
from tlaunch.control import RunHandle
from tlaunch.errors import TLaunchError
from tlaunch.plan import new_run_id
from tlaunch.runtime.records import read_record
from tlaunch.server.jobs import ended_without_run, view_job
from tlaunch.server.packages import ChangedPackage, Packages
from tlaunch.server.starter import Starter
from tlaunch.server.store import JobRow, JobStore
from tlaunch.server.views import Entry, JobIndex
from tlaunch.server.watcher import Watcher

__all__ = ["Launches"]

log = logging.getLogger(__name__)


class Launches:
    """Launches accepted jobs in the background (see the module docstring).

    Args:
        home: the server's ``TLAUNCH_HOME``.
        store: its table of jobs.
        packages: its packages (a job is made again from its row and package).
        index: its view of the jobs.
        watcher: follows a job once launched.
        starter: starts one job (its copy of its package, its clean environment, its launch).
        max_starting: launches at a time.
        timeout: seconds a launch may take to record its run.
        quiet: a launch waits until no job has been accepted for this long (seconds)...
        settle: ...or until its own job was accepted this long ago.
    """

    def __init__(
        self,
        home: str,
        store: JobStore,
        packages: Packages,
        index: JobIndex,
        watcher: Watcher,
        starter: Starter,
        max_starting: int = 4,
        timeout: float = 60.0,
        quiet: float = 0.05,
        settle: float = 1.0,
    ) -> None:
        self.home = home
        self.store = store
        self.packages = packages
        self.index = index
        self.watcher = watcher
        self.starter = starter
        self.timeout = timeout
        self.quiet = quiet
        self.settle = settle
        self._last_accepted = 0.0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_starting, thread_name_prefix="start job")
        self.waits: Callable[[JobRow], bool] = lambda row: False
        """Whether a job waits for something else before it is launched (the pool's placement)."""
        self.on_end: Callable[[JobRow], None] | None = None
        """Told of a job whose launch failed (the server's pool frees what it held)."""

    def accept(self, owner: str, name: str) -> None:
        """Launch ``owner``'s job ``name`` (its row written) as soon as a place is free, once the
        submits coming in have been answered (see the module docstring)."""
        self._last_accepted = accepted = time.monotonic()
        self._pool.submit(self._quietly, self._after_answers, owner, name, accepted)

    def _after_answers(self, owner: str, name: str, accepted: float) -> None:
        while True:
            now = time.monotonic()
            wait = min(self._last_accepted + self.quiet, accepted + self.settle) - now
            if wait <= 0:
                break
            time.sleep(wait)
        self._start(owner, name)

    def recover(self) -> None:
        """Go on with the jobs a server before this one accepted or was launching (at start)."""
        for entry in reversed(self.index.entries()):  # oldest first
            row = entry.row
            if row.final is not None or row.run_id or self.waits(row):
                continue
            if row.started is None:
                self.accept(row.owner, row.name)
            else:
                self._pool.submit(self._quietly, self._found_again, row.owner, row.name)

    def close(self) -> None:
        """Stop launching (jobs waiting are launched by the next server)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _quietly(self, step: Callable[..., None], owner: str, name: str, *more: object) -> None:
        try:
            step(owner, name, *more)
        except Exception as exc:  # never a job left PENDING for a reason nobody sees
            log.exception("launching job %s/%s", owner, name)
            row = self.store.get(owner, name)
            if row is not None and row.final is None and not row.run_id:
                self._failed(row, f"the server could not launch it: {type(exc).__name__}: {exc}")

    def _start(self, owner: str, name: str) -> None:
        row = self.store.get(owner, name)
        if row is None or row.final is not None or row.run_id:  # deleted or stopped while it waited
            return
        found = self.packages.find(owner, str(row.spec.get("trainer_package")))
        if found is None:
            self._failed(row, f"its package {row.spec.get('trainer_package')} is no longer stored")
            return
        run_id = new_run_id(name)
        self.store.update(owner, name, started=time.time(), planned_run=run_id)
        row = self.store.get(owner, name)  # as it is now: a stop or a delete may have come meanwhile
        if row is None or row.final is not None:
            self._show(owner, name)
            return
        self.watcher.refresh(row)
        try:
            handle = self.starter.start(row, *found, run_id=run_id)
        except (TLaunchError, ChangedPackage) as exc:
            self._failed(row, f"job {name!r} could not start: {exc}")
            return
        self._launched(owner, name, handle)

    def _launched(self, owner: str, name: str, handle: RunHandle) -> None:
        row = self.store.get(owner, name)
        if row is None or row.final is not None:  # deleted or stopped while it was being launched
            log.warning("job %s/%s was %s as it launched: stopping its run %s", owner, name,
                        "deleted" if row is None else "stopped", handle.run_id)  # fmt: skip
            self._show(owner, name)
            threading.Thread(target=_stop, args=(handle,), name=f"stop {name}", daemon=True).start()
            return
        self.store.update(owner, name, run_id=handle.run_id)
        self.watcher.adopt(dataclasses.replace(row, run_id=handle.run_id), handle)

    def _found_again(self, owner: str, name: str) -> None:
        """A job a server before this one was launching: its run, once recorded, or FAILED."""
        row = self.store.get(owner, name)
        if row is None or row.final is not None or row.run_id or not row.planned_run:
            if row is not None and row.final is None and not row.run_id:
                self._start(owner, name)  # launching, with no run id said: launched again
            return
        home = self.starter.home_of(owner)  # under --unix-users, the user's own run store
        run_dir = os.path.join(control.runs_dir(home), row.planned_run)
        deadline = (row.started or 0) + self.timeout
        while True:
            try:
                record = read_record(run_dir)
            except (OSError, ValueError):
                record = None
            if record is not None:
                self._launched(owner, name, self.starter.adopt(home, control.attach(run_dir, record)))
                return
            if time.time() > deadline:
                self._failed(row, "the server stopped while launching it, and its launcher recorded no run")
                return
            time.sleep(0.2)

    def _show(self, owner: str, name: str) -> None:
        """Put ``owner``'s job ``name`` in the index as its row is now (a stop kept there meanwhile)."""
        row = self.store.get(owner, name)
        if row is not None:
            self.index.replace(Entry.of(view_job(row)))

    def _failed(self, row: JobRow, reason: str) -> None:
        current = self.store.get(row.owner, row.name)
        if current is None or current.final is not None:  # deleted, or stopped, meanwhile
            return
        view = ended_without_run(dataclasses.replace(current), "FAILED", reason)
        self.store.update(row.owner, row.name, final_state="FAILED", message=reason, final=view.row.final)
        self.index.replace(Entry.of(view))
        log.warning("job %s/%s failed to start: %s", row.owner, row.name, reason)
        if self.on_end is not None:
            self.on_end(view.row)


def _stop(handle: RunHandle) -> None:
    """Stop a run (of a job stopped or deleted as it launched); a failure to is logged."""
    try:
        handle.stop()
    except TLaunchError as exc:
        log.warning("stopping run %s: %s", handle.run_id, exc)
