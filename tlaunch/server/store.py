"""The job server's table of jobs: SQLite (``<home>/server/jobs.db``) or PostgreSQL, with migrations.

A job's row says who submitted what, where, and which run (or SLURM job) runs
it; what a running job is doing is never copied here: it is read from the run
through :mod:`tlaunch.control` whenever asked, so a server restarted mid-job
loses nothing. Once the job has ended, its final view (state, message, exit
code, nodes, root cause, references) is kept in the row (``final``): a
finished job is shown without reading its run, and stays as it ended when its
run's record is pruned. Migrations are numbered SQL scripts, written for both
databases, applied in order at start (the ``schema_version`` table holds the
last one applied). ``JobStore(url)`` takes a path or ``sqlite:///path``
(nothing to install) or ``postgresql://user@host/db`` (``pip install
'psycopg[binary]'``).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tlaunch.server.dsn import hide_password
from tlaunch.server.groupwrite import GroupWrites

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
        created DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX jobs_owner ON jobs (owner, created)
    """,
    """
    ALTER TABLE jobs ADD COLUMN final TEXT;
    CREATE INDEX jobs_final_state ON jobs (final_state)
    """,
    # Job names are per user (alice/train and bob/train both exist): the key is (owner, name).
    """
    CREATE TABLE jobs_by_owner (
        name TEXT NOT NULL,
        owner TEXT NOT NULL,
        spec TEXT NOT NULL,
        labels TEXT NOT NULL DEFAULT '{}',
        run_id TEXT,
        message TEXT,
        final_state TEXT,
        created DOUBLE PRECISION NOT NULL,
        final TEXT,
        PRIMARY KEY (owner, name)
    );
    INSERT INTO jobs_by_owner (name, owner, spec, labels, run_id, message, final_state, created, final)
        SELECT name, owner, spec, labels, run_id, message, final_state, created, final FROM jobs;
    DROP TABLE jobs;
    ALTER TABLE jobs_by_owner RENAME TO jobs;
    CREATE INDEX jobs_owner ON jobs (owner, created);
    CREATE INDEX jobs_final_state ON jobs (final_state);
    CREATE INDEX jobs_name ON jobs (name)
    """,
    # A job is answered as accepted before it is launched: when its launch began, and the run id it
    # was given (the run of a launch a server killed mid-way is found again under that id).
    """
    ALTER TABLE jobs ADD COLUMN started DOUBLE PRECISION;
    ALTER TABLE jobs ADD COLUMN planned_run TEXT
    """,
    # What the server schedules of a job: the pool's (priority, placement), its restarts.
    """
    ALTER TABLE jobs ADD COLUMN scheduling TEXT
    """,
)
"""Schema changes, oldest first: a new one is appended, never edited."""


class DuplicateJob(KeyError):
    """The user has a job of that name."""


@dataclass
class JobRow:
    """One job as the server keeps it."""

    name: str
    owner: str
    spec: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    message: str | None = None
    final_state: str | None = None  # set once the job has ended
    created: float = field(default_factory=time.time)
    final: dict[str, Any] | None = None  # its view as it ended (state, message, exit code, nodes...)
    started: float | None = None  # when its launch began (None: accepted, not launched yet)
    planned_run: str | None = None  # the run id its launch was given (run_id once it is recorded)
    # What the server schedules of it: the pool's (pooled, priority, placement), its restarts
    scheduling: dict[str, Any] | None = None


class JobStore:
    """The jobs table; thread-safe: each thread (the server's request threads, its watcher)
    has a connection of its own, so reads never wait for each other. A PostgreSQL connection
    that breaks (the database restarted) is opened again on the next query.

    Args:
        url: a path or ``sqlite:///path``, or ``postgresql://...``.

    Raises:
        ValueError: a URL of another database, or PostgreSQL without psycopg.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        if url.startswith(("postgresql://", "postgres://")):
            try:
                import psycopg
            except ImportError:
                raise ValueError(
                    f"{hide_password(url)}: PostgreSQL needs psycopg: pip install 'psycopg[binary]'"
                ) from None
            self._connect: Any = lambda: psycopg.connect(url, autocommit=True)
            self._mark = "%s"
            self._broken: tuple[type[Exception], ...] = (psycopg.OperationalError, psycopg.InterfaceError)
            self._writer: Any = contextlib.nullcontext()  # PostgreSQL: writers do not wait for each other
        elif "://" in url and not url.startswith("sqlite:///"):
            raise ValueError(
                f"--db {hide_password(url)!r}: give a path, sqlite:///path or postgresql://user@host/db"
            )
        else:
            path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url
            # timeout: a writer waits (up to 30 s) for another's transaction, instead of failing
            self._connect = lambda: sqlite3.connect(
                path, timeout=30, check_same_thread=False, isolation_level=None
            )
            self._mark = "?"
            self._broken = ()
            self._writer = threading.Lock()
            self._db().execute("PRAGMA journal_mode=WAL")  # kept in the file: readers never wait for a writer
            # A commit is in the file (the WAL) when it returns, safe from a crash of the server;
            # only a crash of the machine may lose the last ones (no fsync per commit).
            self._db().execute("PRAGMA synchronous=NORMAL")
        self._adds = GroupWrites(self._insert, lambda row: DuplicateJob(row.name))
        self.migrate()

    def _db(self) -> Any:
        """This thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            with self._lock:
                self._conns.append(conn)
        return conn

    def _drop(self) -> None:
        """Forget this thread's connection (it broke): the next query opens another."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _sql(self, query: str) -> str:
        return query.replace("?", self._mark)

    def migrate(self) -> int:
        """Apply the migrations not applied yet; the schema version now."""
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            found = db.execute("SELECT version FROM schema_version").fetchone()
            version = int(found[0]) if found else 0
            if found is None:
                db.execute("INSERT INTO schema_version VALUES (0)")
            for number, script in enumerate(MIGRATIONS[version:], version + 1):
                for statement in filter(str.strip, script.split(";")):
                    db.execute(statement)
                db.execute(self._sql("UPDATE schema_version SET version = ?"), (number,))
        return len(MIGRATIONS)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        # SQLite has one writer at a time: this process's writers queue here, rather than in
        # SQLite's busy handler, which sleeps up to 100 ms between its tries (50 submits at once).
        with self._writer:
            yield from self._in_tx()

    def _in_tx(self) -> Iterator[Any]:
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE" if self._mark == "?" else "BEGIN")
        except self._broken:
            self._drop()
            db = self._db()
            db.execute("BEGIN")
        try:
            yield db
        except BaseException:
            with contextlib.suppress(*self._broken):
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _query(self, query: str, args: Sequence[Any] = ()) -> list[Any]:
        try:
            return list(self._db().execute(self._sql(query), tuple(args)).fetchall())
        except self._broken:  # a read is safe to ask again, on a new connection
            self._drop()
            return list(self._db().execute(self._sql(query), tuple(args)).fetchall())

    def add(self, row: JobRow) -> None:
        """Insert ``row``: written (committed) when this returns. Rows added at the same time from
        several threads are written in one transaction (:mod:`tlaunch.server.groupwrite`).

        Raises:
            DuplicateJob: its owner has a job of that name.
        """
        self._adds.submit(row).result()

    def add_soon(self, row: JobRow) -> Future[None]:
        """Insert ``row`` as :meth:`add` does, without waiting: the future is done once it is
        written (:class:`DuplicateJob`: its owner has a job of that name)."""
        return self._adds.submit(row)

    def _insert(self, rows: Sequence[JobRow]) -> list[bool]:
        """Insert ``rows`` in one transaction; for each, whether it was new (False: its owner has a
        job of that name)."""
        query = self._sql(
            f"INSERT INTO jobs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (owner, name) DO NOTHING"
        )
        new = []
        with self._tx() as db:
            for row in rows:
                cur = db.execute(
                    query,
                    (row.name, row.owner, json.dumps(row.spec), json.dumps(row.labels), row.run_id,
                     row.message, row.final_state, row.created,
                     None if row.final is None else json.dumps(row.final), row.started, row.planned_run,
                     None if row.scheduling is None else json.dumps(row.scheduling)),
                )  # fmt: skip
                new.append(cur.rowcount == 1)
        return new

    def update(self, owner: str, name: str, **values: object) -> None:
        """Set columns of ``owner``'s job ``name`` (``run_id``, ``message``, ``final_state``, ``final``,
        ``started``, ``planned_run``, ``scheduling``)."""
        allowed = {"run_id", "message", "final_state", "final", "started", "planned_run", "scheduling"}
        assert set(values) <= allowed, values
        for key in ("final", "scheduling"):
            if key in values:
                values[key] = None if values[key] is None else json.dumps(values[key])
        sets = ", ".join(f"{k} = ?" for k in values)
        with self._tx() as db:
            db.execute(
                self._sql(f"UPDATE jobs SET {sets} WHERE owner = ? AND name = ?"),
                (*values.values(), owner, name),
            )

    def get(self, owner: str, name: str) -> JobRow | None:
        """``owner``'s job ``name``, if any."""
        found = self._query(f"SELECT {_COLUMNS} FROM jobs WHERE owner = ? AND name = ?", (owner, name))
        return _row(found[0]) if found else None

    def named(self, name: str) -> builtins.list[JobRow]:
        """Every user's job named ``name`` (an admin's look-up without an owner)."""
        return [_row(r) for r in self._query(f"SELECT {_COLUMNS} FROM jobs WHERE name = ?", (name,))]

    def list(
        self,
        *,
        owner: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[JobRow]:
        """Jobs, newest first (only ``owner``'s, with every label of ``labels``, if given)."""
        query, args = f"SELECT {_COLUMNS} FROM jobs", []
        if owner is not None:
            query, args = query + " WHERE owner = ?", [owner]
        rows = [_row(r) for r in self._query(query + " ORDER BY created DESC", args)]
        wanted = dict(labels or {})
        rows = [r for r in rows if all(r.labels.get(k) == v for k, v in wanted.items())]
        return rows[offset : offset + limit]

    def all(self) -> builtins.list[JobRow]:
        """Every job, newest first (what the server holds in memory: :mod:`tlaunch.server.views`)."""
        return [_row(r) for r in self._query(f"SELECT {_COLUMNS} FROM jobs ORDER BY created DESC")]

    def live(self) -> builtins.list[JobRow]:
        """The jobs that have a run and have not been seen to end, oldest first."""
        query = (
            f"SELECT {_COLUMNS} FROM jobs WHERE final_state IS NULL AND run_id IS NOT NULL ORDER BY created"
        )
        return [_row(r) for r in self._query(query)]

    def run_ids(self, owner: str) -> set[str]:
        """The run ids of ``owner``'s jobs."""
        found = self._query("SELECT run_id FROM jobs WHERE owner = ? AND run_id IS NOT NULL", (owner,))
        return {str(r[0]) for r in found}

    def delete(self, owner: str, name: str) -> None:
        """Forget ``owner``'s job ``name``."""
        with self._tx() as db:
            db.execute(self._sql("DELETE FROM jobs WHERE owner = ? AND name = ?"), (owner, name))

    def close(self) -> None:
        """Write the rows queued, then close every connection."""
        self._adds.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()


_COLUMNS = (
    "name, owner, spec, labels, run_id, message, final_state, created, final, started, planned_run, "
    "scheduling"
)


def _row(values: Sequence[Any]) -> JobRow:
    name, owner, spec, labels, run_id, message, final_state, created, final, started, planned, sched = values
    return JobRow(
        name,
        owner,
        json.loads(spec),
        json.loads(labels),
        run_id,
        message,
        final_state,
        created,
        None if final is None else json.loads(final),
        started,
        planned,
        None if sched is None else json.loads(sched),
    )
