"""Where a node waits in a debugger: :class:`Pause`, as the run's state holds it."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Pause", "paused_in_log"]

# What a paused node prints (tlaunch.runtime.debugger.session), read back from a log where its
# coordinator cannot be asked (a Kubernetes pod's, from outside the cluster).
_ANNOUNCED = re.compile(
    r"waiting for a debugger: tlaunch debug \S+ (?P<key>\S+) \((?P<kind>breakpoint|post-mortem) at "
    r"(?P<file>.+?):(?P<line>\d+)(?:, rank (?P<rank>[^:)]+))?(?:: (?P<exception>.*))?\)\s*$"
)
_WENT_ON = re.compile(r"^tlaunch: (?:(?P<key>\S+) goes on: |the debugger of (?P<left>\S+) left \()")


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
        rank: the paused process's ``RANK``, when it is a torch worker of the node.
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
    rank: str | None = None

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
        rank = f", rank {self.rank}" if self.rank is not None else ""
        return f"paused at {self.at} ({self.kind}{rank}{attached})"


def paused_in_log(lines: Iterable[str]) -> dict[str, Pause]:
    """The nodes a log shows waiting in a debugger now: each one's last announcement that no
    "goes on" line followed (only what the line says: no address, ``since`` 0)."""
    found: dict[str, Pause] = {}
    for text in lines:
        if "tlaunch" not in text:  # most lines: one test
            continue
        went = _WENT_ON.search(text)
        if went is not None:
            found.pop(went.group("key") or went.group("left"), None)
            continue
        m = _ANNOUNCED.search(text)
        if m is not None:
            at = f"{m.group('file')}:{m.group('line')}"
            found[m.group("key")] = Pause(
                at, m.group("file"), int(m.group("line")), "", m.group("kind"), "", 0.0,
                exception=m.group("exception"), rank=m.group("rank"),
            )  # fmt: skip
    return found
