"""``tlaunch debug [RUN] [NODE]``: list the nodes waiting in a debugger, and be the terminal of one.

A renderer over :mod:`tlaunch.control.debug`: it lists, picks, connects, then relays
lines between this terminal and the node's pdb. The remote prompt (``(Pdb) ``) is
given to :func:`input`, so line editing and history (readline) work as in a local
pdb. The session ends when the node goes on (``c``, ``q``: the node closes it), or
with Ctrl-D or Ctrl-C here (the node goes on too).
"""

from __future__ import annotations

import contextlib
import select
import signal
import ssl
import sys
import threading
import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tlaunch import control
from tlaunch.control import debug
from tlaunch.errors import DebugError, LaunchError, RunNotFoundError

__all__ = ["main", "relay"]

console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)
_PROMPT_QUIET = 0.03  # s without more output after which a trailing partial line is a prompt


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
    if not sys.stdin.isatty():
        console.print("several nodes wait: give one, `tlaunch debug RUN NODE`")
        return None
    while True:
        try:
            answer = input(f"attach to which (1-{len(found)}, empty: none)? ").strip()
        except EOFError:
            return None
        if not answer:
            return None
        if answer.isdigit() and 1 <= int(answer) <= len(found):
            return found[int(answer) - 1]


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


def relay(sock: ssl.SSLSocket) -> int:
    """Be the terminal of the pdb at the other end of ``sock`` until either side ends it.

    Returns:
        0 once the node ended the session; 1 if it refused this machine's key.
    """
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (input() gets line editing and history)
    out = _Output(sock)
    reader = threading.Thread(target=out.run, name="tlaunch-debug-reader", daemon=True)
    reader.start()
    try:
        while True:
            prompt = out.next_prompt()
            if prompt is None:
                break
            try:
                line = input(prompt)
            except EOFError:  # Ctrl-D: leave; the node goes on
                sys.stdout.write("\n")
                break
            except KeyboardInterrupt:  # Ctrl-C here, or the node ended the session (see _Output)
                if out.ended.is_set():
                    break
                sys.stdout.write("\n")
                break
            try:
                sock.sendall(line.encode() + b"\n")
            except OSError:
                break
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(2)
        reader.join(2.0)
    if out.refused:
        refused = "tlaunch: the node refused this connection: it is not of its run's key"
        console.print(Text(refused, style="red"))
        return 1
    return 0


class _Output:
    """The reader of the node's side: prints what comes, hands a trailing prompt to ``input``."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock
        self._cond = threading.Condition()
        self._prompt: str | None = None
        self.ended = threading.Event()
        self.refused = False
        self._waiting = False  # the main thread is in input()
        self._main = threading.main_thread().ident

    def next_prompt(self) -> str | None:
        """The node's next prompt, once it asks; None once the session has ended."""
        with self._cond:
            self._waiting = False
            self._cond.wait_for(lambda: self._prompt is not None or self.ended.is_set())
            if self._prompt is None:
                return None
            prompt, self._prompt = self._prompt, None
            self._waiting = True
            return prompt

    def run(self) -> None:
        pending = ""
        got_any = False
        try:
            while True:
                buffered = self._sock.pending() > 0  # decrypted already: select would not see it
                wait = None if not pending else _PROMPT_QUIET
                ready = buffered or bool(select.select([self._sock], [], [], wait)[0])
                if not ready:  # quiet after a partial line: a prompt
                    with self._cond:
                        self._prompt, pending = pending, ""
                        self._cond.notify_all()
                    continue
                try:
                    data = self._sock.recv(65536).decode("utf-8", "replace")
                except ssl.SSLError:
                    self.refused = not got_any
                    data = ""
                except OSError:
                    data = ""
                if not data:
                    break
                got_any = True
                text = pending + data
                head, nl, pending = text.rpartition("\n")
                if nl:
                    sys.stdout.write(head + nl)
                    sys.stdout.flush()
        finally:
            if pending:
                sys.stdout.write(pending + "\n")
                sys.stdout.flush()
            with self._cond:
                self.ended.set()
                waiting = self._waiting
                self._cond.notify_all()
            if waiting and self._main is not None:  # wake input() in the main thread
                with contextlib.suppress(ProcessLookupError, OSError):
                    signal.pthread_kill(self._main, signal.SIGINT)
