"""The job server's table of jobs: SQLite (``<home>/server/jobs.db``), with schema migrations.

A job's row says who submitted what, where, and which run (or SLURM job) runs
it; what the job is doing is never copied here: it is read from the run
through :mod:`tlaunch.control` whenever asked, so a server restarted mid-job
loses nothing. Migrations are numbered SQL scripts applied in order at start
(``PRAGMA user_version`` holds the last one applied).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DuplicateJob", "JobRow", "JobStore", "MIGRATIONS"]

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE jobs (
        name TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        spec TEXT NOT NULL,
        labels TEXT NOT NULL DEFAULT '{}',
        run_id TEXT,
        message TEXT,
        final_state TEXT,
        created REAL NOT NULL
    );
    CREATE INDEX jobs_owner ON jobs (owner, created);
    """,
)
"""Schema changes, oldest first: a new one is appended, never edited."""


class DuplicateJob(KeyError):
    """A job of that name exists."""


@dataclass
class JobRow:
    """One job as the server keeps it."""

    name: str
    owner: str
    spec: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    message: str | None = None
    final_state: str | None = None  # set once the job ended and its run can no longer say (LOST)
    created: float = field(default_factory=time.time)


class JobStore:
    """The jobs table (thread-safe: the server's request threads share it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self.migrate()

    def migrate(self) -> int:
        """Apply the migrations not applied yet; the schema version now."""
        with self._lock:
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            for number, script in enumerate(MIGRATIONS[version:], version + 1):
                self._db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")
            return len(MIGRATIONS)

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def add(self, row: JobRow) -> None:
        """Insert ``row``.

        Raises:
            DuplicateJob: a job of that name exists.
        """
        try:
            with self._tx() as db:
                db.execute(
                    "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (row.name, row.owner, json.dumps(row.spec), json.dumps(row.labels), row.run_id,
                     row.message, row.final_state, row.created),
                )  # fmt: skip
        except sqlite3.IntegrityError:
            raise DuplicateJob(row.name) from None

    def update(self, name: str, **values: object) -> None:
        """Set columns of job ``name`` (``run_id``, ``message``, ``final_state``)."""
        allowed = {"run_id", "message", "final_state"}
        assert set(values) <= allowed, values
        sets = ", ".join(f"{k} = ?" for k in values)
        with self._tx() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE name = ?", (*values.values(), name))

    def get(self, name: str) -> JobRow | None:
        """Job ``name``, if any."""
        with self._lock:
            found = self._db.execute("SELECT * FROM jobs WHERE name = ?", (name,)).fetchone()
        return None if found is None else _row(found)

    def list(
        self,
        *,
        owner: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[JobRow]:
        """Jobs, newest first (only ``owner``'s, with every label of ``labels``, if given)."""
        query, args = "SELECT * FROM jobs", []
        if owner is not None:
            query, args = query + " WHERE owner = ?", [owner]
        with self._lock:
            rows = [_row(r) for r in self._db.execute(query + " ORDER BY created DESC", args)]
        wanted = dict(labels or {})
        rows = [r for r in rows if all(r.labels.get(k) == v for k, v in wanted.items())]
        return rows[offset : offset + limit]

    def delete(self, name: str) -> None:
        """Forget job ``name``."""
        with self._tx() as db:
            db.execute("DELETE FROM jobs WHERE name = ?", (name,))

    def close(self) -> None:
        """Close the database."""
        self._db.close()


def _row(values: Sequence[Any]) -> JobRow:
    name, owner, spec, labels, run_id, message, final_state, created = values
    return JobRow(name, owner, json.loads(spec), json.loads(labels), run_id, message, final_state, created)
