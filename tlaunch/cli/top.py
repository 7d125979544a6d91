"""``tlaunch top [RUN]``: every node of a run, live: host, state, CPU, memory, GPU, restarts, last line.

A renderer over :mod:`tlaunch.control.metrics` (the coordinator's samples, taken
once a second by each node's supervisor) and the run's logs (followed by a thread
for the last line of each node). Sorted by ``--sort`` (hottest first); a node that
uses more memory than its host has left is shown in red with ``!``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tlaunch import control
from tlaunch.control import metrics
from tlaunch.control.metrics import NodeUse
from tlaunch.errors import LaunchError, RunNotFoundError

__all__ = ["main", "render"]

console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)
_LINE = 60  # characters of a node's last line shown


def _size(n: int | None) -> str:
    if n is None:
        return ""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def render(run_id: str, rows: list[NodeUse], last_lines: dict[str, str], sort: str) -> Table:
    """The table of ``rows`` (as :func:`tlaunch.control.metrics.top` sorted them)."""
    table = Table(title=f"{run_id}  (sorted by {sort}; {time.strftime('%H:%M:%S')})", title_justify="left")
    for name in ("node", "host", "state", "CPU %", "memory", "GPU %", "GPU mem", "threads", "files"):
        table.add_column(
            name, justify="right" if name[0].isupper() or name in ("memory", "threads", "files") else "left"
        )
    table.add_column("restarts", justify="right")
    table.add_column("last line", overflow="ellipsis", max_width=_LINE)
    for r in rows:
        s = r.last
        memory = _size(s.rss) + (" !" if r.flagged else "") if s else ""
        cells = [
            r.node,
            r.host,
            r.state,
            f"{s.cpu:.0f}" if s else "",
            memory,
            f"{s.gpu:.0f}" if s and s.gpu is not None else "",
            _size(s.gpu_mem) if s else "",
            str(s.threads) if s else "",
            str(s.fds) if s else "",
            str(r.restarts),
            last_lines.get(r.node, "")[:_LINE],
        ]
        table.add_row(*(Text(c) for c in cells), style="red" if r.flagged else None)
    return table


class _LastLines:
    """The last line of each node's log, followed by a thread (until the run ends)."""

    def __init__(self, handle: control.RunHandle) -> None:
        self.lines: dict[str, str] = {}
        self._handle = handle
        threading.Thread(target=self._follow, name="tlaunch-top-logs", daemon=True).start()

    def _follow(self) -> None:
        try:
            for line in self._handle.logs(follow=True):
                if line.text.strip():
                    self.lines[line.node] = line.text.strip()
        except (LaunchError, KeyError, OSError):
            return


def _find(run: str | None) -> control.RunHandle:
    if run is not None:
        return control.find_run(run)
    for handle in control.list_runs():
        if not handle.snapshot().ended:
            return handle
    raise RunNotFoundError("no run is running here; give a run id: tlaunch top RUN")


def _frames(handle: control.RunHandle, sort: str, interval: float) -> Iterator[Table | Group]:
    lines = _LastLines(handle)
    while True:
        rows = metrics.top(handle, sort)
        yield render(handle.run_id, rows, lines.lines, sort)
        if handle.snapshot().ended:
            return
        time.sleep(interval)


def main(run: str | None, sort: str, once: bool, interval: float) -> int:
    """Show the run's nodes (live, or ``once``)."""
    if sort not in metrics.SORT_KEYS:
        raise SystemExit(f"tlaunch: --sort {sort!r} is not one of {', '.join(metrics.SORT_KEYS)}")
    if interval <= 0:
        raise SystemExit(f"tlaunch: --interval {interval} must be a number of seconds > 0")
    try:
        handle = _find(run)
    except (RunNotFoundError, LaunchError) as exc:
        raise SystemExit(f"tlaunch: {exc}") from None
    if once:
        last = {}
        try:
            for line in handle.logs(follow=False):
                if line.text.strip():
                    last[line.node] = line.text.strip()
        except (LaunchError, KeyError, OSError):
            pass
        console.print(render(handle.run_id, metrics.top(handle, sort), last, sort))
        return 0
    with Live(console=console, auto_refresh=False, screen=False) as live:
        for frame in _frames(handle, sort, interval):
            live.update(frame, refresh=True)
    console.print(f"run {handle.run_id} has ended")
    return 0
