"""How a launched run ends on its launcher's side: its teardown, once, in order (:class:`RunEnd`).

Whoever ends the run (a ``wait`` that saw it stop, ``stop()``, the reaper
thread, a second Ctrl-C), the end goes the same way, once: the coordinator
is told, the backend stops the run's processes (within the run's stop grace),
then the launcher's side is closed and the run's end recorded, with
interrupts held so that nothing of it is abandoned half-done::

    teardown ─▶ coordinator.stop ─▶ backend.stop(grace) ─▶ close: runtime, context,
       │                               │ KeyboardInterrupt      coordinator, run.keys,
       │ KeyboardInterrupt             ▼                        the end record
       └──────────────────────▶ kill at once (backend.stop(0))
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tlaunch import context
from tlaunch.backends.base import Backend, CoordinatorLink
from tlaunch.runtime.node_runtime import NodeRuntime
from tlaunch.runtime.records import RunRecord, write_record

__all__ = ["RunEnd", "interrupts_held"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold SIGINT back (main thread only) while the block runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass(eq=False)
class RunEnd:
    """The end of one run on its launcher's side (see the module docstring).

    Attributes:
        run_id, run_dir, coordinator, backend, runtime, record: the run's, as its launcher holds it.
        torn_down: the teardown has run.
        detached: the launcher left the run going without it (no teardown then).
        stop_error: what the backend's stop raised (something of the run outlived its kill).
        outcome_failure: the root cause its launcher judged (``Run.stop(failure=)``), recorded
            when no node failed.
    """

    run_id: str
    run_dir: str
    coordinator: CoordinatorLink
    backend: Backend
    runtime: NodeRuntime
    record: RunRecord | None
    torn_down: bool = False
    detached: bool = False
    stop_error: Exception | None = None
    outcome_failure: dict[str, Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def mark_detached(self) -> bool:
        """Mark the run detached; False if it was already, or has been torn down."""
        with self._lock:
            if self.detached or self.torn_down:
                return False
            self.detached = True
            return True

    def teardown(self) -> None:
        """Stop the backend's processes, close what the launcher holds, record the end; once.

        An interrupt while a stop is under way (here, or in the reaper thread)
        kills the run's processes at once: a second Ctrl-C never abandons a run.
        An error of the backend's stop is kept in :attr:`stop_error`.
        """
        try:
            self._lock.acquire()
        except KeyboardInterrupt:  # the reaper is stopping the run gracefully: hurry it
            self._kill_at_once()
            raise
        try:
            if self.torn_down or self.detached:
                return
            self.torn_down = True
            self.coordinator.stop("the run is being torn down")
            try:
                self.backend.stop(self.coordinator.stop_grace())
            except KeyboardInterrupt:
                self._kill_at_once()
                raise
            except Exception as exc:  # StopError: something of the run outlived its kill
                self.stop_error = exc
            finally:
                with interrupts_held():
                    self._close()
        finally:
            self._lock.release()

    def _close(self) -> None:
        """Close the launcher's side of the run and record its end (logs and record stay)."""
        self.runtime.close()
        context.uninstall_if(self.runtime)
        self.coordinator.close()
        path = os.path.join(self.run_dir, "run.keys")  # the secrets go
        if os.path.exists(path):
            os.unlink(path)
        if self.record is not None:
            self.record.ended = True
            self.record.final_status = self.coordinator.status()
            self.record.stop_reason = self.coordinator.stop_reason
            self.record.stop_kind = self.coordinator.stop_kind
            failure = self.coordinator.failure
            self.record.failure = self.outcome_failure if failure is None else dataclasses.asdict(failure)
            try:
                write_record(self.run_dir, self.record)
            except OSError as exc:  # a full disk: the run has stopped all the same
                log.warning("could not record the end of run %s in %s: %s", self.run_id, self.run_dir, exc)

    def _kill_at_once(self) -> None:
        """A second interrupt during the stop: kill every process of the run now, then go on.

        Further interrupts are held back until the kill is done: a run is never
        abandoned half-stopped.
        """
        sys.stderr.write(f"tlaunch: interrupted again: killing run {self.run_id} at once\n")
        with interrupts_held():
            self.backend.stop(0.0)
