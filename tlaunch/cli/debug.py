"""``tlaunch debug [RUN] [NODE]``: list the nodes waiting in a debugger, and be the terminal of one.

A renderer over :mod:`tlaunch.control.debug`: it lists, picks, connects, then is the
terminal of the node's pdb (:mod:`tlaunch.runtime.debugger.terminal`); with ``--dap``,
an editor's bridge (:mod:`tlaunch.control.dap`).
"""

from __future__ import annotations

import ssl
import sys
import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tlaunch import control
from tlaunch.cli.prompt import pick_one
from tlaunch.control import debug
from tlaunch.errors import DebugError, LaunchError, RunNotFoundError
from tlaunch.runtime.debugger import terminal

__all__ = ["main", "relay"]

console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)


def _table(found: list[debug.PausedNode]) -> Table:
    table = Table("#", "run", "node", "host", "paused at", "kind", "since", "debugger")
    for i, p in enumerate(found, 1):
        since = time.strftime("%H:%M:%S", time.localtime(p.pause.since))
        who = "attached" if p.pause.attached else "waiting"
        cells = (i, p.run_id, p.node, p.host, p.pause.at, p.pause.kind, since, who)
        table.add_row(*(Text(str(c)) for c in cells))
    return table


def main(run: str | None, node: str | None, wait: float, *, dap: bool = False, port: int = 0) -> int:
    """List paused nodes (of ``run``, or of every run), or attach to ``node`` (or the only one);
    ``dap``: serve it to an editor on local port ``port`` instead (:mod:`tlaunch.control.dap`)."""
    if dap:
        if run is None or node is None:
            raise SystemExit("tlaunch debug --dap needs RUN and NODE (tlaunch debug lists the paused nodes)")
        return _serve_dap(run, node, wait, port)
    try:
        if run is None:
            found = debug.paused_everywhere()
            handle = None
        else:
            handle = control.find_run(run)
            if node is not None:
                return _attach(handle, node, wait)
            found = debug.paused(handle)
    except (RunNotFoundError, LaunchError, DebugError, KeyError) as exc:
        raise SystemExit(f"tlaunch: {exc.args[0] if isinstance(exc, KeyError) else exc}") from None
    if not found:
        where = f"run {run}" if run else "any run"
        console.print(f"no node of {where} waits in a debugger")
        return 0
    chosen = _choose(found)
    if chosen is None:
        return 0
    try:
        return _attach(handle or control.find_run(chosen.run_id), chosen.node, 0.0)
    except (RunNotFoundError, LaunchError, DebugError, KeyError) as exc:
        raise SystemExit(f"tlaunch: {exc}") from None


def _serve_dap(run: str, node: str, wait: float, port: int) -> int:
    from tlaunch.control import dap

    try:
        bridge = dap.open_bridge(control.find_run(run), node, port, wait=wait)
    except dap.DapRefused as exc:  # the node still waits: its pdb, here
        console.print(exc.session.greeting)
        console.print(Text(f"tlaunch: {exc}; here is its pdb instead", style="yellow"))
        try:
            return relay_prompted(exc.session.sock)
        finally:
            exc.session.close()
    except (RunNotFoundError, LaunchError, DebugError, KeyError) as exc:
        raise SystemExit(f"tlaunch: {exc.args[0] if isinstance(exc, KeyError) else exc}") from None
    console.print(bridge.session.greeting)
    port_ = bridge.address.rpartition(":")[2]
    config = (
        f'{{"type": "debugpy", "request": "attach", "connect": {{"host": "127.0.0.1", "port": {port_}}}}}'
    )
    console.print(f"DAP of {node} on {bridge.address} (one editor, of your user): attach with {config}")
    sys.stdout.flush()
    try:
        bridge.serve()
    except KeyboardInterrupt:
        bridge.close()
    console.print(f"tlaunch: the editor left; {node} goes on")
    return 0


def _choose(found: list[debug.PausedNode]) -> debug.PausedNode | None:
    """The one paused node; else the one picked at a prompt (a terminal), else none (listed)."""
    if len(found) == 1:
        return found[0]
    console.print(_table(found))
    picked = pick_one(len(found), console, "several nodes wait: give one, `tlaunch debug RUN NODE`")
    return None if picked is None else found[picked]


def _attach(handle: control.RunHandle, node: str, wait: float) -> int:
    try:
        session = debug.connect(handle, node, wait=wait)
    except (DebugError, KeyError) as exc:
        raise SystemExit(f"tlaunch: {exc.args[0] if isinstance(exc, KeyError) else exc}") from None
    sys.stdout.write(session.greeting + "\n")
    try:
        return relay(session.sock)
    finally:
        session.close()


def relay_prompted(sock: ssl.SSLSocket) -> int:
    """:func:`relay` of a session whose pdb has written its prompt already."""
    return 0 if not terminal.relay(sock, "(Pdb) ") else 1


def relay(sock: ssl.SSLSocket) -> int:
    """Be the terminal of the pdb at the other end of ``sock`` until either side ends it.

    Returns:
        0 once the node ended the session; 1 if it refused this machine's key.
    """
    if terminal.relay(sock):
        refused = "tlaunch: the node refused this connection: it is not of its run's key"
        console.print(Text(refused, style="red"))
        return 1
    return 0
