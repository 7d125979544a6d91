"""What a coordinator shows of its nodes beside their states: pauses in a debugger, resource samples.

:class:`Observed` is a part of :class:`~tlaunch.runtime.coordinator.Coordinator`
(its methods are the coordinator's, served with them over the run's RPC):

* a node that stops in a debugger (``breakpoint()``, a post-mortem:
  :mod:`tlaunch.runtime.debugger`) says so with :meth:`Observed.paused` and
  :meth:`Observed.resumed`; the pause is part of its record, so ``tlaunch ps``,
  the dashboard and ``control`` show it, and ``tlaunch debug`` finds where to attach;
* a supervisor's heartbeat (:meth:`Observed.report`) carries a resource sample of
  its node's processes (:mod:`tlaunch.runtime.sampling`), once a second: no call
  more than the heartbeat it was. The last :data:`WINDOW` samples of each node
  are kept (:class:`Windows`) and read with :meth:`Observed.metrics`; they are not
  part of the records (a summary would carry every node's every second).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tlaunch.runtime.sampling import Sample

if TYPE_CHECKING:
    from tlaunch.runtime.noderecord import NodeRecord

__all__ = ["WINDOW", "Observed", "Windows"]

WINDOW = 300
"""Samples kept per node: five minutes at one a second."""


class Windows:
    """The last :data:`WINDOW` samples of each node (thread-safe)."""

    def __init__(self, size: int = WINDOW) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._by_key: dict[str, deque[Sample]] = {}

    def add(self, key: str, sample: Sample) -> None:
        """Keep ``sample`` as node ``key``'s latest."""
        with self._lock:
            window = self._by_key.get(key)
            if window is None:
                window = self._by_key[key] = deque(maxlen=self._size)
            window.append(sample)

    def since(self, after: float, keys: Iterable[str] | None = None) -> dict[str, list[Sample]]:
        """Each node's samples taken after ``after`` (seconds since the epoch); nodes without any left out."""
        with self._lock:
            wanted = self._by_key if keys is None else {k: self._by_key[k] for k in keys if k in self._by_key}
            out = {}
            for key, window in wanted.items():
                old = window and window[0].t <= after
                taken = [s for s in window if s.t > after] if old else list(window)
                if taken:
                    out[key] = taken
            return out


class Observed:
    """Pauses and resource samples of a coordinator's nodes (see the module docstring)."""

    _cond: threading.Condition
    _windows: Windows

    def _record(self, key: str) -> NodeRecord:
        raise NotImplementedError

    def _changed(self, *keys: str) -> None:
        raise NotImplementedError

    def wait_stop(self, key: str | None = None, timeout: float = 2.0) -> bool:
        raise NotImplementedError

    # -- debugger -----------------------------------------------------------
    def paused(self, key: str, pause: Mapping[str, Any]) -> None:
        """Node ``key`` waits in a debugger, or a debugger attached (``pause``: where and how;
        :class:`tlaunch.runtime.debugger.Pause` as a dict)."""
        with self._cond:
            self._record(key).paused = dict(pause)
            self._changed(key)

    def resumed(self, key: str, note: str | None = None) -> None:
        """Node ``key`` goes on (its debugger continued, quit or was lost); ``note``: what a
        post-mortem came to, kept for the report of its failure."""
        with self._cond:
            rec = self._record(key)
            rec.paused = None
            if note is not None:
                rec.debugged = note
            self._changed(key)

    # -- resource samples --------------------------------------------------------
    def report(self, key: str, sample: Sample | None, timeout: float = 1.0) -> bool:
        """A supervisor's heartbeat with its node's latest sample: :meth:`wait_stop` once kept."""
        if sample is not None:
            self._windows.add(key, Sample(*sample))
        return self.wait_stop(key, timeout)

    def add_samples(self, samples: Mapping[str, Sample]) -> None:
        """Samples of several nodes at once (a sampler of the launcher's: ``local_mp``)."""
        for key, sample in samples.items():
            self._windows.add(key, Sample(*sample))

    def metrics(self, since: float = 0.0, keys: list[str] | None = None) -> dict[str, list[Sample]]:
        """Each node's samples taken after ``since`` (seconds since the epoch; 0: all kept)."""
        return self._windows.since(since, keys)
