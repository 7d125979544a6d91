"""The pool's own log of placements: what was held and released, when, for which job (JSON lines).

``<home>/server/placements.log``, one line per event, appended and flushed
before the job it concerns starts (a hold) or after its resources are free (a
release)::

    {"t": 1700000000.1, "event": "hold", "job": "a", "user": "alice", "host": "th1", "gpus": [0, 1],
     "visible": "GPU-...,GPU-...", "cpus": [0], "memory": 0}
    {"t": 1700000009.7, "event": "release", "job": "a", "host": "th1", "gpus": [0, 1], ..., "why": "ended"}

:func:`overlaps` reads it back and says whether any GPU was ever held by two
jobs at once (what the tests and an operator check).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from tlaunch.pool.resources import Host, Slot

__all__ = ["Journal", "overlaps", "read_journal"]


class Journal:
    """Appends placement events to ``path`` (0600), one JSON object a line; thread-safe."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8")

    def write(
        self, event: str, job: str, slots: Sequence[Slot], hosts: dict[str, Host], **extra: Any
    ) -> None:
        """Log ``event`` (``hold`` or ``release``) of ``job``'s ``slots``, one line per slot."""
        now = time.time()
        lines = []
        for slot in slots:
            host = hosts.get(slot.host)
            visible = host.visible_devices(slot.gpus) if host is not None and slot.gpus else ""
            record = {"t": now, "event": event, "job": job, "host": slot.host, "gpus": list(slot.gpus),
                      "visible": visible, "cpus": list(slot.cpus), "memory": slot.memory,
                      **extra}  # fmt: skip
            lines.append(json.dumps(record) + "\n")
        with self._lock:
            self._file.writelines(lines)
            self._file.flush()

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._file.close()


def read_journal(path: str) -> list[dict[str, Any]]:
    """Every event of the log at ``path``, in order (a line cut short by a crash is skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def overlaps(events: Iterable[dict[str, Any]]) -> list[str]:
    """Every moment the log shows a GPU held by two jobs at once (none: an empty list)."""
    holder: dict[tuple[str, int], str] = {}
    found = []
    for e in events:
        for gpu in e.get("gpus", []):
            key = (e["host"], int(gpu))
            if e["event"] == "hold":
                if key in holder and holder[key] != e["job"]:
                    both = f"{holder[key]!r} and {e['job']!r}"
                    found.append(f"GPU {gpu} of {e['host']} held by {both} at {e['t']}")
                holder[key] = e["job"]
            elif e["event"] == "release" and holder.get(key) == e["job"]:
                del holder[key]
    return found
