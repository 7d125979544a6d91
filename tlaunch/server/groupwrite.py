"""Rows added at the same time, written together: a group commit for the job server's table.

A writer thread of its own writes every row queued by then in one
transaction; each row's future is done once its row is written. 50 submits
at once made 50 transactions, one after the other behind SQLite's one writer,
each a hand-over of the lock and of the interpreter between threads; now a
few, and a submit on the event loop waits for its row without a thread of
its own. A batch that fails is written again row by row, so that one row's
error is its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

__all__ = ["GroupWrites"]

Row = TypeVar("Row")


class GroupWrites(Generic[Row]):
    """Writes rows in batches (see the module docstring).

    Args:
        insert: writes rows in one transaction; for each, whether it was new.
        duplicate: what a row that was not new fails with (called with the row).
    """

    def __init__(
        self,
        insert: Callable[[Sequence[Row]], list[bool]],
        duplicate: Callable[[Row], BaseException],
    ) -> None:
        self._insert = insert
        self._duplicate = duplicate
        self._cond = threading.Condition()
        self._queued: list[tuple[Row, Future[None]]] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, row: Row) -> Future[None]:
        """Queue ``row``; its future is done once it is written (or failed)."""
        done: Future[None] = Future()
        with self._cond:
            if self._closed:
                done.set_exception(RuntimeError("the job store is closed"))
                return done
            self._queued.append((row, done))
            if self._thread is None:
                self._thread = threading.Thread(target=self._write, name="job rows", daemon=True)
                self._thread.start()
            self._cond.notify()
        return done

    def close(self) -> None:
        """Write what is queued, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(30)

    def _write(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._closed:
                    self._cond.wait()
                batch, self._queued = self._queued, []
            if not batch:
                return
            self._outcomes(batch)

    def _outcomes(self, batch: list[tuple[Row, Future[None]]]) -> None:
        """Write ``batch``; each row's outcome to its future."""
        try:
            new = self._insert([row for row, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
                return
            for one in batch:
                self._outcomes([one])
            return
        for (row, done), was_new in zip(batch, new, strict=True):
            if was_new:
                done.set_result(None)
            else:
                done.set_exception(self._duplicate(row))
