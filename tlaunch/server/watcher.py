"""The server's watcher: it follows every running job's run, and every run a dashboard watches.

Twice a second (``every``) it asks each run that has not ended how it is
(its backend's :meth:`~tlaunch.control.RunHandle.snapshot`: the coordinator's
RPC for a local or SSH run, ``squeue`` for SLURM...), a few at a time, and:

- puts each job's new view in the server's :class:`~tlaunch.server.views.JobIndex`
  when it changed (status, lists and their streams read it from there);
- keeps the final view of a job that has ended in its row (once, whoever asks);
- keeps the last snapshot of each run a dashboard's event stream follows
  (:meth:`Watcher.watch`), so a thousand open streams of one run cost one
  question per round, not a thousand.

Each run's handle is found once (from its record) and kept while it runs. A
run whose record is gone (``LOST``) is looked for again every ten seconds, not
every round.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from tlaunch import control
from tlaunch.control import RunHandle, RunSnapshot
from tlaunch.errors import TLaunchError
from tlaunch.runtime.records import read_record
from tlaunch.server.jobs import JobView, final_of, view_job
from tlaunch.server.store import JobRow, JobStore
from tlaunch.server.views import Entry, JobIndex

__all__ = ["Watcher"]

log = logging.getLogger(__name__)
_MISSING_AGAIN = 10.0  # seconds before a run not found is looked for again


@dataclasses.dataclass(frozen=True)
class _Seen:
    """A run's last snapshot, and how many times it changed (a stream compares the count)."""

    snapshot: RunSnapshot
    version: int


class Watcher:
    """Follows the server's running jobs and watched runs (see the module docstring).

    Args:
        home: the server's ``TLAUNCH_HOME`` (its run store).
        store: its table of jobs (the ends are kept there).
        index: its view of the jobs, kept current here.
        find: the handle of a run (its id, and its job's owner when known; under ``--unix-users``
            each user's runs are in a store of their own), None if no store has it (default: the
            run of ``home``'s store).
        every: seconds between rounds.
        workers: runs asked at the same time.
    """

    def __init__(
        self,
        home: str,
        store: JobStore,
        index: JobIndex,
        find: Callable[[str, str | None], RunHandle | None] | None = None,
        every: float = 0.5,
        workers: int = 8,
    ):
        self.home = home
        self.store = store
        self.index = index
        self._find = find or self._in_home
        self._owners: dict[str, str] = {}  # run id -> its job's owner
        self.every = every
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="watch run")
        self._lock = threading.Lock()
        self._handles: dict[str, RunHandle] = {}
        self._missing: dict[str, float] = {}  # run id -> when to look for it again
        self._watched: Counter[str] = Counter()
        self._seen: dict[str, _Seen] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0
        """Rounds done (a stream of a run waits for the round after it asked to watch it)."""
        self.restart: Callable[[JobRow, JobView], bool] | None = None
        """Asked, as a job's end is seen, whether it runs again (then its end is not kept)."""
        self.on_end: Callable[[JobRow], None] | None = None
        """Told of a job whose end was kept (the server's pool frees what it held)."""

    # -- the jobs ------------------------------------------------------------------
    def load(self) -> None:
        """Fill the index from the table, and ask the running jobs' runs how they are (one round)."""
        self.index.load([Entry.of(view_job(row)) for row in self.store.all()])
        self.round()

    def adopt(self, row: JobRow, handle: RunHandle) -> Entry:
        """Follow the run of ``row`` (its launch has just returned ``handle``); the job's entry now."""
        with self._lock:
            self._handles[handle.run_id] = handle
            self._missing.pop(handle.run_id, None)
        return self.refresh(row)

    def refresh(self, row: JobRow) -> Entry:
        """Ask ``row``'s run how it is now and put the job's view in the index; its entry."""
        if row.run_id:
            self._owners[row.run_id] = row.owner
        snap = self._snapshot(row.run_id) if row.run_id and row.final is None else None
        return self._publish(row, snap if isinstance(snap, RunSnapshot) else None)

    def handle(self, run_id: str | None, owner: str | None = None) -> RunHandle | None:
        """The handle of run ``run_id`` (of a job of ``owner``, if known): found once, then kept."""
        if not run_id:
            return None
        with self._lock:
            handle = self._handles.get(run_id)
        if handle is not None:
            return handle
        handle = self._find(run_id, owner or self._owners.get(run_id))
        if handle is None:
            return None
        with self._lock:
            self._handles[run_id] = handle
        return handle

    def _in_home(self, run_id: str, owner: str | None) -> RunHandle | None:
        run_dir = os.path.join(control.runs_dir(self.home), run_id)
        try:
            return control.attach(run_dir, read_record(run_dir))
        except (OSError, ValueError, TLaunchError):
            return None

    def _publish(self, row: JobRow, snap: RunSnapshot | None) -> Entry:
        handle = self._handles.get(row.run_id or "") if snap is not None and snap.state.ended else None
        view = view_job(row, snap, handle)
        ended = view.snapshot is not None and view.snapshot.state.ended
        if ended and self.restart is not None and self.restart(row, view):  # it runs again: PENDING
            again = self.store.get(row.owner, row.name)
            view, ended = view_job(again or row), False
        if ended:  # its end, kept once in its row
            final = final_of(view)
            row = dataclasses.replace(row, final=final, final_state=view.state, message=view.message)
            self.store.update(row.owner, row.name, final_state=view.state, message=view.message, final=final)
            view = dataclasses.replace(view, row=row)
            if self.on_end is not None:
                self.on_end(row)
        entry = Entry.of(view)
        old = self.index.get(row.owner, row.name)
        if old is None or old.body != entry.body or old.row.final != row.final:
            self.index.replace(entry)
        return self.index.get(row.owner, row.name) or entry

    # -- the runs streams watch ----------------------------------------------------
    def watch(self, run_id: str, handle: RunHandle | None = None) -> None:
        """Follow run ``run_id`` (``handle``: its handle, as found) until :meth:`unwatch` (as many
        times as it was watched)."""
        with self._lock:
            self._watched[run_id] += 1
            if handle is not None:
                self._handles.setdefault(run_id, handle)

    def unwatch(self, run_id: str) -> None:
        """One watcher of run ``run_id`` less."""
        with self._lock:
            self._watched[run_id] -= 1
            if self._watched[run_id] <= 0:
                del self._watched[run_id]
                self._seen.pop(run_id, None)

    def seen(self, run_id: str) -> tuple[RunSnapshot, int] | None:
        """The last snapshot of a watched run, and its version (None: not asked yet)."""
        seen = self._seen.get(run_id)
        return None if seen is None else (seen.snapshot, seen.version)

    # -- the rounds ----------------------------------------------------------------
    def start(self) -> None:
        """Start watching (a daemon thread)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="job watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.round()
            except Exception:  # the next round tries again; the views stay as they were
                log.exception("watching the jobs")
            self._stop.wait(max(0.05, self.every - (time.monotonic() - began)))

    def round(self) -> None:
        """Ask every running job's run and every watched run how it is, once."""
        live = [e.row for e in self.index.entries() if e.row.final is None and e.row.run_id]
        self._owners.update((r.run_id, r.owner) for r in live if r.run_id)
        with self._lock:
            watched = set(self._watched)
        run_ids = list(dict.fromkeys([*(r.run_id for r in live if r.run_id), *watched]))
        snaps = dict(zip(run_ids, self._pool.map(self._snapshot, run_ids), strict=True))
        for run_id in watched:
            snap = snaps.get(run_id)
            if isinstance(snap, RunSnapshot):
                with self._lock:
                    old = self._seen.get(run_id)
                    if run_id in self._watched and (old is None or old.snapshot != snap):
                        self._seen[run_id] = _Seen(snap, (old.version + 1) if old else 1)
        for row in live:
            snap = snaps.get(row.run_id or "")
            if snap is _UNKNOWN:
                continue
            current = self.index.get(row.owner, row.name)
            if current is None or current.row.final is not None:  # deleted, or ended, meanwhile
                continue
            self._publish(current.row, snap if isinstance(snap, RunSnapshot) else None)
        self._forget(r for r in (e.row for e in self.index.entries()) if r.final is not None)
        self.rounds += 1

    def _forget(self, ended: Iterable[JobRow]) -> None:
        """Drop the handles of runs that have ended and nobody watches."""
        with self._lock:
            for row in ended:
                if row.run_id and row.run_id not in self._watched:
                    self._handles.pop(row.run_id, None)

    def _snapshot(self, run_id: str | None) -> RunSnapshot | object | None:
        """Run ``run_id`` now; None: it cannot be found; ``_UNKNOWN``: asking failed (kept as it was)."""
        if not run_id:
            return None
        with self._lock:
            again = self._missing.get(run_id)
        if again is not None and time.monotonic() < again:
            return None
        handle = self.handle(run_id)
        if handle is None:
            with self._lock:
                self._missing[run_id] = time.monotonic() + _MISSING_AGAIN
            return None
        try:
            return handle.snapshot()
        except Exception as exc:  # a host that cannot be reached now, a cluster that did not answer...
            log.warning("asking run %s how it is: %s", run_id, exc)
            return _UNKNOWN


_UNKNOWN = object()
