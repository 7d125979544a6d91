"""``tlaunch job debug NAME [NODE]``: a paused node of a server's job, debugged through the server.

The server holds the job's run key and relays the node's pdb (:mod:`tlaunch.jobs.debugging`);
here is the same terminal as ``tlaunch debug``'s (:mod:`tlaunch.runtime.debugger.terminal`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tlaunch.cli.prompt import pick_one
from tlaunch.runtime.debugger import terminal

__all__ = ["add_debug_command"]


def add_debug_command(jobs: Any, console: Console, client: Callable[[], Any]) -> None:
    """Add ``tlaunch job debug`` to the ``tlaunch job`` subcommands."""
    p = jobs.add_parser(
        "debug",
        help="list a job's nodes waiting in a debugger (breakpoint(), post-mortem), or attach pdb to one",
        description="Through the server, which holds the job's run key: no key or port of the run here.",
    )
    p.add_argument("name", help="the job (an admin: owner/name for another user's)")
    p.add_argument("node", nargs="?", help="the node to attach to (default: the only paused one)")
    p.add_argument("--wait", type=float, default=0.0, metavar="S", help="seconds to wait for NODE to pause")
    p.set_defaults(func=lambda a: _debug(a, console, client))


def _debug(a: argparse.Namespace, console: Console, client: Callable[[], Any]) -> int:
    from tlaunch.jobs import JobServerError

    with client() as c:
        try:
            node = a.node
            if node is None:
                node = _choose(c.paused(a.name), a.name, console)
                if node is None:
                    return 0
            session = c.debug(a.name, node, wait=a.wait)
        except JobServerError as exc:
            raise SystemExit(f"tlaunch: {exc}") from None
    sys.stdout.write(session.greeting + "\n")
    try:
        terminal.relay(session.sock)
    finally:
        session.close()
    return 0


def _choose(found: list[dict[str, Any]], job: str, console: Console) -> str | None:
    """The one paused node; else the one picked at a prompt (a terminal), else none (listed)."""
    if not found:
        console.print(f"no node of job {job} waits in a debugger")
        return None
    if len(found) == 1:
        return str(found[0]["node"])
    table = Table("#", "node", "host", "paused at", "kind", "since", "debugger")
    for i, p in enumerate(found, 1):
        since = time.strftime("%H:%M:%S", time.localtime(p["since"]))
        who = "attached" if p["attached"] else "waiting"
        table.add_row(*(Text(str(c)) for c in (i, p["node"], p["host"], p["at"], p["kind"], since, who)))
    console.print(table)
    picked = pick_one(len(found), console, f"several nodes wait: give one, `tlaunch job debug {job} NODE`")
    return None if picked is None else str(found[picked]["node"])
