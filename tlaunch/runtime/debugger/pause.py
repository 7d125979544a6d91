"""Where a node waits in a debugger: :class:`Pause`, as the run's state holds it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["Pause"]


@dataclasses.dataclass(frozen=True)
class Pause:
    """Where a node waits in a debugger, as its record holds it (``NodeRecord.paused``).

    Attributes:
        at: ``file:line`` with the file's base name (``train.py:42``).
        file: the file's path on the node's host.
        line: the line.
        function: the function's name.
        kind: ``breakpoint`` or ``post-mortem``.
        address: where a debugger connects (``host:port``; only the run's key opens it).
        since: when it paused, seconds since the epoch.
        attached: whether a debugger is attached now.
        pid: the paused process.
        exception: a post-mortem's exception (``ValueError: bad input``).
    """

    at: str
    file: str
    line: int
    function: str
    kind: str
    address: str
    since: float
    attached: bool = False
    pid: int = 0
    exception: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As plain values (what the coordinator keeps)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> Pause | None:
        """From a node record's ``paused`` (None: not paused); fields it does not know are left out."""
        if not record:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in known})

    def __str__(self) -> str:
        attached = ", a debugger attached" if self.attached else ""
        return f"paused at {self.at} ({self.kind}{attached})"
