"""A pdb whose terminal is a debugger's connection: :class:`RemotePdb`.

It is the standard :class:`pdb.Pdb` (every command: ``p``, ``n``, ``s``, ``up``,
``b``, ``interact``...) reading and writing a :class:`Wire` instead of the node's
own stdin and stdout. What differs is what ends a session, since a node must never
hang because a terminal went away:

* ``c`` ends the session once no breakpoint is left (with breakpoints set, the
  session stays for the next stop);
* ``q`` (and ``exit``) clears the breakpoints and lets the node go on, rather than
  raising ``BdbQuit`` into it;
* a lost connection (the debugger's terminal killed, its machine gone: end of
  stream, a reset, unanswered keepalives) reads as ``q``.

A stop with no debugger connected (the first, or one after a session ended at a
breakpoint) waits for one through the ``wait`` callable the node gives.
"""

from __future__ import annotations

import code
import contextlib
import pdb
import ssl
import sys
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["RemotePdb", "TerminalWire", "Wire"]


class Wire:
    """A text stream over a debugger's connection that never raises: a failure marks it lost."""

    encoding = "utf-8"

    def __init__(self) -> None:
        self._sock: ssl.SSLSocket | None = None
        self._pending = b""
        self.lost = False

    @property
    def connected(self) -> bool:
        """Whether a debugger is connected and the connection holds."""
        return self._sock is not None and not self.lost

    @property
    def sock(self) -> ssl.SSLSocket | None:
        """The debugger's connection (None: none, or the terminal's)."""
        return None if self.lost else self._sock

    def attach(self, sock: ssl.SSLSocket) -> None:
        """Use ``sock`` (a new debugger's connection) from now on."""
        self._sock, self._pending, self.lost = sock, b"", False

    def write(self, text: str) -> int:
        """Send ``text``; a failure marks the wire lost (what was not sent is dropped)."""
        if self._sock is not None and not self.lost:
            try:
                self._sock.sendall(text.encode("utf-8", "replace"))
            except OSError:
                self.lost = True
        return len(text)

    def flush(self) -> None:
        """Nothing to flush: every write is sent at once."""

    def isatty(self) -> bool:
        """Not a terminal (pdb then prompts with ``write``, not ``input``)."""
        return False

    def readline(self) -> str:
        """The next line from the debugger; ``""`` (end of file) once the connection is lost."""
        while b"\n" not in self._pending:
            if self._sock is None or self.lost:
                return ""
            try:
                chunk = self._sock.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                self.lost = True
                rest, self._pending = self._pending, b""
                return rest.decode("utf-8", "replace")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line.decode("utf-8", "replace") + "\n"

    def close(self) -> None:
        """Close the connection (the debugger sees its end); idempotent."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(2)  # SHUT_RDWR
            sock.close()


class TerminalWire(Wire):
    """The process's own terminal as a :class:`Wire`: a node thread's pdb where its run is this
    process's alone (threads: no other process can reach its coordinator or key)."""

    @property
    def connected(self) -> bool:
        """Always: the terminal is there."""
        return not self.lost

    def write(self, text: str) -> int:
        sys.stdout.write(text)
        sys.stdout.flush()
        return len(text)

    def readline(self) -> str:
        line = sys.stdin.readline()
        self.lost = not line
        return line

    def close(self) -> None:
        """Nothing to close: the terminal stays."""


class RemotePdb(pdb.Pdb):
    """pdb over a :class:`Wire` (see the module docstring).

    Args:
        wait: called at a stop with no debugger connected, with the stop's frame and
            line; returns whether one connected (then the wire is attached). False: the
            node goes on (the run stops, or nobody came in time).
        left: called once a session ends (``c``, ``q``, a lost connection).
    """

    def __init__(
        self,
        wait: Callable[[FrameType, int], bool],
        left: Callable[[str], None],
        wire: Wire | None = None,
    ) -> None:
        self.wire = wire or Wire()
        super().__init__(
            stdin=self.wire,  # type: ignore[arg-type]
            stdout=self.wire,  # type: ignore[arg-type]
            skip=["tlaunch.runtime.debugger*"],
            nosigint=True,
            readrc=False,
        )
        self._wait = wait
        self._left = left
        self._leave: str | None = None  # why the session ends once this stop's commands are done
        self._in_session = False  # a debugger is on the wire, between two stops of its session
        self._exception: BaseException | None = None  # a post-mortem's
        self._handed_over = False  # the thread went to pydevd (DAP) at this stop

    # -- a stop -------------------------------------------------------------
    def interaction(self, frame: FrameType | None, tb_or_exc: Any) -> None:
        """Wait for a debugger if none is connected, then run its commands at this stop."""
        where, line = _where(frame, tb_or_exc)
        if not (self._in_session and self.wire.connected):
            if where is None or not self._wait(where, line):
                self.clear_all_breaks()
                self.set_continue()
                return
            self._in_session = True
        self._leave = None
        try:
            super().interaction(frame, tb_or_exc)
        finally:
            why = self._leave or ("lost" if self.wire.lost else None)
            if why is not None:
                self._end(why)

    def _end(self, why: str) -> None:
        self._in_session = False
        if why == "dap":  # the connection carries DAP now; its relay tells of the session's end
            return
        if why != "lost":
            self.wire.write("tlaunch: the node goes on; detached\n")
        self.wire.close()
        self._left(why)

    # -- commands that end a session -----------------------------------------
    def do_continue(self, arg: str) -> bool | None:
        """c(ont(inue)): go on; the session ends unless a breakpoint is set."""
        if not self.breaks:
            self._leave = "continued"
        return super().do_continue(arg)

    do_c = do_cont = do_continue

    def do_quit(self, arg: str) -> bool:
        """q(uit), exit: clear the breakpoints, end the session; the node goes on (it is not aborted)."""
        self.clear_all_breaks()
        self._leave = "quit"
        self.set_continue()
        return True

    do_q = do_exit = do_quit

    def do_EOF(self, arg: str) -> bool:
        """End of input (the debugger left): as ``quit``."""
        self.message("")
        self.do_quit(arg)
        self._leave = "lost"
        return True

    def do_interact(self, arg: str) -> None:
        """interact: a Python console on the current frame's names, over the same connection."""
        assert self.curframe is not None
        names = {**self.curframe.f_globals, **self.curframe_locals}
        console = _Console(self.wire, names)
        console.interact("*interactive* (Ctrl-D ends it)", exitmsg="")

    def do_tlaunch_dap(self, arg: str) -> bool | None:
        """tlaunch_dap: hand this stop to pydevd and serve the Debug Adapter Protocol on this
        connection (what ``tlaunch debug --dap`` sends; see :mod:`tlaunch.runtime.debugger.dap`)."""
        from tlaunch.runtime.debugger import dap

        sock = self.wire.sock
        why = dap.unavailable()
        if why is not None or sock is None or self.curframe is None:
            self.error(f"no DAP session here: {why or 'no connection'}; this stop is pdb's")
            return None
        frame = self.curframe
        self.clear_all_breaks()
        self.set_continue()  # pdb lets go of the thread first: pydevd's trace takes it from here
        self._leave = "dap"
        refused = dap.serve(sock, frame, self._left, self._exception)
        if refused is not None:
            self.wire.write(f"tlaunch: {refused}; the node goes on\n")
            self._leave = "continued"
            return True
        self._handed_over = True
        return True

    def trace_dispatch(self, frame: FrameType, event: str, arg: Any) -> Any:
        """bdb's, except right after a stop handed to pydevd: the frame keeps pydevd's trace."""
        result = super().trace_dispatch(frame, event, arg)
        if self._handed_over:
            self._handed_over = False
            return frame.f_trace
        return result

    def set_trace_at(self, frame: FrameType) -> None:
        """Stop at ``frame``'s next line (``breakpoint()`` in it)."""
        self.set_trace(frame)

    def post_mortem_of(self, exc: BaseException) -> None:
        """Stop at the frames of exception ``exc``'s traceback (one the node raised)."""
        self._exception = exc
        tb = exc.__traceback__
        self.reset()
        self.interaction(None, tb)


class _Console(code.InteractiveConsole):
    """``interact``'s console, reading and writing the debugger's wire."""

    def __init__(self, wire: Wire, names: dict[str, Any]) -> None:
        super().__init__(names)
        self._wire = wire

    def raw_input(self, prompt: str = "") -> str:
        self._wire.write(prompt)
        line = self._wire.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def write(self, data: str) -> None:
        self._wire.write(data)

    def runcode(self, code: Any) -> None:
        out = sys.stdout
        sys.stdout = self._wire  # print() in the console goes to the debugger
        try:
            super().runcode(code)
        finally:
            sys.stdout = out


def _where(frame: FrameType | None, tb_or_exc: Any) -> tuple[FrameType | None, int]:
    """The frame a stop shows, and its line: ``frame``'s, else the innermost of a traceback."""
    if frame is not None:
        return frame, frame.f_lineno
    tb = tb_or_exc.__traceback__ if isinstance(tb_or_exc, BaseException) else tb_or_exc
    if not isinstance(tb, TracebackType):
        return None, 0
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame, tb.tb_lineno
