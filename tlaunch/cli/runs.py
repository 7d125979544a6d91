"""``tlaunch ps``, ``logs``, ``attach`` and ``stop``: renderers over :mod:`tlaunch.control`.

Everything they know of a run comes from its :class:`~tlaunch.control.RunHandle`
(whatever backend runs it); this module only prints and turns errors into
exit codes.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tlaunch import control
from tlaunch.control import Attachable, LogLine, RunHandle, RunNotFoundError, RunSnapshot
from tlaunch.display import Printer
from tlaunch.errors import LaunchError, StopError

__all__ = ["attach", "logs", "ps", "state_text", "stop"]

# Piped output (scripts, tests) gets full run ids rather than an 80-column cut.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)


def _find(run: str) -> RunHandle:
    try:
        return control.find_run(run)
    except (RunNotFoundError, LaunchError) as exc:
        raise SystemExit(f"tlaunch: {exc}") from None


def state_text(snap: RunSnapshot) -> str:
    """How ``ps`` shows a run's state: ``running``, ``ended (stopped)``, ``pending (SLURM job 7 ...)``."""
    state = snap.state.value.lower()
    if snap.state.ended:
        return f"ended ({state})"
    return f"{state} ({snap.reason})" if snap.reason and snap.state.value != "STOPPING" else state


def _row(*cells: object) -> list[Text]:
    """Table cells as plain text: labels and reasons are never read as rich markup."""
    return [Text("" if c is None else str(c)) for c in cells]


def ps(run: str | None) -> int:
    """List runs, or one run's nodes."""
    if run is None:
        table = Table("run", "program", "backend", "hosts", "state", "nodes")
        for handle in control.list_runs():
            snap = handle.snapshot()
            counts = Counter(n.state for n in snap.nodes)
            nodes = " ".join(f"{k}={n}" for k, n in sorted(counts.items()))
            hosts = ",".join(snap.hosts)
            table.add_row(*_row(snap.run_id, snap.program, snap.backend, hosts, state_text(snap), nodes))
        console.print(table)
        return 0
    snap = _find(run).snapshot()
    console.print(Text(f"run {snap.run_id} ({snap.program}, {snap.backend}): {state_text(snap)}"))
    if snap.reason and (snap.state.ended or snap.state.value == "STOPPING"):
        console.print(Text(f"stopped because {snap.reason}"))
    if snap.failure is not None:
        fail = snap.failure
        how = fail.reason or f"exited with code {fail.exit_code}"
        console.print(Text(f"first failure: node {fail.node} on {fail.host} {how}", style="red"))
    table = Table("node", "host", "state", "pid", "exit", "reason")
    for node in snap.nodes:
        state = f"{node.state}, {node.paused}" if node.paused else node.state
        table.add_row(*_row(node.key, node.host, state, node.pid or "", node.exit_code, node.reason))
    console.print(table)
    return 0


def stop(run: str) -> int:
    """Stop a run, whatever runs it, and confirm it has ended."""
    handle = _find(run)
    if handle.snapshot().ended:
        console.print(f"run {handle.run_id} has already ended")
        return 0
    try:
        handle.stop()
    except (StopError, LaunchError) as exc:
        console.print(Text(str(exc), style="red"))
        return 1
    console.print(Text(f"run {handle.run_id} stopped ({state_text(handle.snapshot())})"))
    return 0


def attach(run: str, node: str | None) -> int:
    """Open the tmux window of a node (or the run's coordinator) in this terminal."""
    handle = _find(run)
    if not isinstance(handle, Attachable):
        raise SystemExit(f"tlaunch: run {handle.run_id} has no terminal to attach to")
    try:
        argv = handle.attach_argv(node)
    except (LaunchError, KeyError) as exc:
        raise SystemExit(f"tlaunch: {exc.args[0] if isinstance(exc, KeyError) else exc}") from None
    os.execvp(argv[0], argv)
    return 0  # pragma: no cover - exec does not return


def logs(run: str, node: str | None, follow: bool) -> int:
    """Print (and with ``follow``, keep printing) the logs of a run's nodes."""
    handle = _find(run)
    try:
        lines = handle.logs(node, follow=follow)
        _print_lines(lines)
    except KeyError as exc:
        raise SystemExit(f"tlaunch: {exc.args[0]}") from None
    except LaunchError as exc:
        raise SystemExit(f"tlaunch: {exc}") from None
    return 0


def _print_lines(lines: Iterator[LogLine]) -> None:
    """Each line as ``[where] text``: coloured by node on a terminal, plain when piped."""
    printer = Printer(console) if sys.stdout.isatty() else None
    out: TextIO = sys.stdout
    for line in lines:
        if printer is not None and line.where:
            printer.line(line.where, line.text)
        else:
            out.write(f"{line}\n")
            out.flush()
