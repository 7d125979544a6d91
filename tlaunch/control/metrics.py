"""Resource use of a run's nodes, as their watchers sampled it: what ``tlaunch top`` and the dashboard show.

Each node's supervisor (the launcher's thread for ``local_mp``) samples the node's
processes once a second (:mod:`tlaunch.runtime.sampling`) and its run's coordinator
keeps the last five minutes of each (:mod:`tlaunch.runtime.observed`). Here they are
read back, with the node's state, as plain values::

    from tlaunch import control

    run = control.find_run("trainer-2026")
    for row in control.metrics.top(run):               # hottest first
        print(row.node, row.host, row.last.cpu, row.last.rss, row.flagged)
    history = control.metrics.samples(run, since=time.time() - 120)   # key -> [Sample]

A run whose coordinator cannot be asked (ended, or not this machine's to ask) has
none: its samples lived in its coordinator. A run on Kubernetes is asked through the
API server's port-forward to its coordinator's pod (:class:`~tlaunch.backends.reaching.Reachable`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tlaunch.backends.handle import NodeStatus, RunHandle
from tlaunch.backends.reaching import Forward, Reachable
from tlaunch.errors import LaunchError, RPCError
from tlaunch.runtime.records import coordinator_client, read_record
from tlaunch.runtime.sampling import Sample

__all__ = ["SORT_KEYS", "NodeUse", "samples", "top"]

SORT_KEYS = ("cpu", "mem", "gpu", "gpu_mem", "threads", "fds", "restarts", "node", "host", "state")
"""What :func:`top` sorts by (descending for numbers, ascending for names)."""


@dataclass(frozen=True)
class NodeUse:
    """One node's state and resource use, as ``tlaunch top`` shows a row.

    Attributes:
        node: its key.
        host: its host.
        state: its state (with ``paused at ...`` where it waits in a debugger).
        restarts: how often it was restarted.
        last: its latest sample (None: none yet, or it has ended).
        history: its samples of the window asked for, oldest first.
        flagged: why it deserves a look (it uses more memory than its host has left), or None.
    """

    node: str
    host: str
    state: str
    restarts: int
    last: Sample | None
    history: tuple[Sample, ...] = ()
    flagged: str | None = None

    def value(self, key: str) -> float | str:
        """The value :func:`top` sorts by for ``key`` (one of :data:`SORT_KEYS`)."""
        last = self.last
        numbers = {
            "cpu": last.cpu if last else -1.0,
            "mem": float(last.rss) if last else -1.0,
            "gpu": last.gpu if last and last.gpu is not None else -1.0,
            "gpu_mem": float(last.gpu_mem) if last and last.gpu_mem is not None else -1.0,
            "threads": float(last.threads) if last else -1.0,
            "fds": float(last.fds) if last else -1.0,
            "restarts": float(self.restarts),
        }
        if key in numbers:
            return numbers[key]
        return str(getattr(self, key))


def samples(handle: RunHandle, since: float = 0.0) -> dict[str, list[Sample]]:
    """Each node's samples taken after ``since`` (seconds since the epoch; 0: all its coordinator keeps).

    Empty for a run that has ended or whose coordinator cannot be asked from here.
    """
    run_dir = getattr(handle, "run_dir", None)
    if not isinstance(run_dir, str):
        return {}
    try:
        record = read_record(run_dir)
    except (OSError, ValueError):
        return {}
    if record.ended or record.preparing:
        return {}
    forward: Forward | None = None
    try:
        if isinstance(handle, Reachable):  # its coordinator is reached through its backend's channel
            forward = handle.reach(record.coordinator)
        client = coordinator_client(run_dir, record, forward.address if forward else None)
    except (OSError, LaunchError):  # its keys are gone (it has just ended), or it cannot be reached
        if forward is not None:
            forward.close()
        return {}
    try:
        got = client.metrics(since)
    except RPCError:
        return {}
    finally:
        client.close()
        if forward is not None:
            forward.close()
    return {str(k): [Sample(*s) for s in v] for k, v in dict(got).items()}


def _flag(last: Sample | None) -> str | None:
    if last is None or last.host_available is None:
        return None
    if last.rss > last.host_available:
        return f"uses {last.rss >> 20} MiB, more than its host has left ({last.host_available >> 20} MiB)"
    return None


def _state(node: NodeStatus) -> str:
    return f"{node.state}, {node.paused}" if node.paused is not None else node.state


def top(handle: RunHandle, sort: str = "cpu", window: float = 0.0) -> list[NodeUse]:
    """Every node of the run with its latest sample, sorted by ``sort`` (hottest first).

    ``window``: seconds of history to include in each row (0: the latest sample only).

    Raises:
        ValueError: ``sort`` is not one of :data:`SORT_KEYS`.
    """
    if sort not in SORT_KEYS:
        raise ValueError(f"sort={sort!r} is not one of {list(SORT_KEYS)}")
    snap = handle.snapshot()
    since = time.time() - max(window, 5.0)
    by_node = samples(handle, since) if not snap.ended else {}
    rows = []
    for node in snap.nodes:
        got = by_node.get(node.key, [])
        last = got[-1] if got and node.state not in ("done", "failed", "stopped") else None
        history = tuple(got) if window > 0 else ()
        rows.append(NodeUse(node.key, node.host, _state(node), node.restarts, last, history, _flag(last)))
    rows.sort(key=lambda r: r.value(sort), reverse=sort not in ("node", "host", "state"))
    return rows
