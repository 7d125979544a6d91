"""The server's view of its jobs: each job as the API shows it, in memory, kept current by its watcher.

``GET /v1/jobs/<name>`` and ``GET /v1/jobs`` answer from here: no database
query and no call to a run's coordinator per request, only the job's JSON,
made once each time the job changes (:class:`Entry`). What fills it:

- at start, every row of the jobs' table (:meth:`JobIndex.load`);
- a submit, at once (the job ``PENDING``, before its launcher starts);
- the watcher (:mod:`tlaunch.server.watcher`), which asks each running job's
  run how it is twice a second and puts the new view here when it changed;
- the starter (:mod:`tlaunch.server.starter`), as a job's launch begins, succeeds or fails.

The table stays the record (a restarted server loads it again); this is the
server's one copy of what it shows, so one server process serves a database.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tlaunch.server.jobs import ENDED, JobView
from tlaunch.server.store import JobRow

__all__ = ["Entry", "JobIndex", "Key", "dumps", "key_of"]

Key = tuple[str, str]
"""A job's key: its owner and its name (names are per user)."""


def key_of(row: JobRow) -> Key:
    """The key of ``row``'s job."""
    return (row.owner, row.name)


def dumps(data: Any) -> bytes:
    """JSON as the server answers it (as FastAPI's own ``JSONResponse``)."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Entry:
    """One job as the API shows it now.

    Attributes:
        row: its row (as the table holds it).
        state: its state (``PENDING``, ``RUNNING``...).
        body: its JSON form, made once per change.
    """

    row: JobRow
    state: str
    body: bytes

    @property
    def ended(self) -> bool:
        """Whether the job has ended."""
        return self.state in ENDED

    @classmethod
    def of(cls, view: JobView) -> Entry:
        """The entry of ``view``."""
        return cls(view.row, view.state, dumps(view.to_dict()))


class JobIndex:
    """Every job of the server, newest first; safe to read from the event loop while threads write.

    An entry is replaced whole, never changed in place, so a reader sees a job as it
    was or as it is, never half of each.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Key, Entry] = {}
        self._order: list[tuple[float, str, str]] = []  # (-created, owner, name): newest first
        self._owned: dict[str, list[tuple[float, str, str]]] = {}  # the same, by owner

    def load(self, entries: list[Entry]) -> None:
        """Hold ``entries`` (every job), in place of what was held."""
        with self._lock:
            self._entries = {key_of(e.row): e for e in entries}
            self._order = sorted((-e.row.created, *key_of(e.row)) for e in entries)
            self._owned = {}
            for item in self._order:
                self._owned.setdefault(item[1], []).append(item)

    def put(self, entry: Entry) -> None:
        """Add or replace the job of ``entry``."""
        key = key_of(entry.row)
        with self._lock:
            old = self._entries.get(key)
            if old is not None and old.row.created != entry.row.created:
                self._unorder((-old.row.created, *key))
                old = None
            self._entries[key] = entry
            if old is None:
                item = (-entry.row.created, *key)
                bisect.insort(self._order, item)
                bisect.insort(self._owned.setdefault(key[0], []), item)

    def _unorder(self, item: tuple[float, str, str]) -> None:
        """Take ``item`` out of the orders (the lock held)."""
        self._order.remove(item)
        owned = self._owned[item[1]]
        owned.remove(item)
        if not owned:
            del self._owned[item[1]]

    def replace(self, entry: Entry) -> bool:
        """Replace the job of ``entry`` if it is still held (not deleted meanwhile); whether it was."""
        with self._lock:
            if key_of(entry.row) not in self._entries:
                return False
        self.put(entry)
        return True

    def remove(self, owner: str, name: str) -> None:
        """Forget ``owner``'s job ``name``."""
        with self._lock:
            old = self._entries.pop((owner, name), None)
            if old is not None:
                self._unorder((-old.row.created, owner, name))

    def get(self, owner: str, name: str) -> Entry | None:
        """``owner``'s job ``name``, if held."""
        return self._entries.get((owner, name))

    def named(self, name: str) -> list[Entry]:
        """Every user's job named ``name`` (an admin's look-up without an owner)."""
        return [e for (_, n), e in list(self._entries.items()) if n == name]

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry]:
        """Every job, newest first."""
        with self._lock:
            return [self._entries[(owner, name)] for _, owner, name in self._order]

    def page(
        self,
        *,
        owner: str | None,
        labels: Mapping[str, str],
        state: str | None,
        limit: int,
        offset: int,
    ) -> tuple[list[Entry], int]:
        """The jobs of a page of a listing, newest first, and how many match in all.

        Args:
            owner: only this user's jobs (None: everyone's).
            labels: only jobs with every one of these labels.
            state: only jobs in this state.
        """
        with self._lock:
            order = self._order if owner is None else self._owned.get(owner, [])
            if state is None and not labels:  # a slice of the order: no job but the page's is looked at
                return [self._entries[(o, n)] for _, o, n in order[offset : offset + limit]], len(order)
            order, entries = list(order), self._entries
        out: list[Entry] = []
        total = 0
        wanted = list(labels.items())
        for _, who, name in order:
            entry = entries.get((who, name))
            if entry is None:
                continue
            row = entry.row
            if owner is not None and row.owner != owner:
                continue
            if wanted and any(row.labels.get(k) != v for k, v in wanted):
                continue
            if state is not None and entry.state != state:
                continue
            if offset <= total < offset + limit:
                out.append(entry)
            total += 1
        return out, total
