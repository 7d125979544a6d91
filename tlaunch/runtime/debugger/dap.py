"""A paused node served to an editor: the Debug Adapter Protocol over the debugger's own connection.

``tlaunch debug --dap RUN NODE`` attaches as for pdb (the run's TLS, its key), then
asks the node's pdb for DAP (:data:`COMMAND`). The node then hands its thread from pdb
to pydevd (debugpy's debugger, which speaks DAP itself) and relays pydevd's
connection to the debugger's::

    editor ─DAP─▶ 127.0.0.1:P (user's machine, its user only) ─TLS, the run's key─▶ node
        node: pydevd ──connects to──▶ 127.0.0.1:Q (this process's listener, this process only)

pydevd only connects out, to a loopback port of the node's own process, open until
pydevd's connection comes: a connection to it from any other process (another user of
the host, another process of the same user) is refused by the kernel's word on whose
socket it is (:func:`~tlaunch.runtime.debugger.peers.peer_is_this_process`). No port
of the node's host ever takes a debugger from outside the process.

The paused thread stops in pydevd at the line it was paused at; the editor sees every
thread, steps, evaluates and continues, and a ``breakpoint()`` the node reaches
meanwhile stops in the editor. When the editor leaves (its connection ends), pydevd
stops tracing, ``breakpoint()`` pauses for ``tlaunch debug`` again, and the node goes
on. One DAP session per process: pydevd stays loaded once it has run; a later pause
of the same process is pdb's (asked for DAP, it says so and stays pdb's).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from tlaunch.runtime.debugger.peers import peer_is_this_process
from tlaunch.sockets import copy_until_end

__all__ = ["COMMAND", "READY", "serve", "unavailable"]

COMMAND = "tlaunch_dap"
"""The pdb command a debugger sends to turn its session into DAP."""
READY = "tlaunch: serving the Debug Adapter Protocol"
"""The line the node sends once DAP follows on the connection."""
_ACCEPT = 30.0  # seconds pydevd has to connect to its listener

_served: list[bool] = []  # a DAP session ran in this process (debugpy starts once)


def _no_trace(thread: threading.Thread) -> threading.Thread:
    thread.pydev_do_not_trace = True  # type: ignore[attr-defined]  # pydevd leaves its relays alone
    thread.daemon = True
    return thread


def unavailable() -> str | None:
    """Why this process cannot serve a DAP session (None: it can)."""
    if _served:
        return "this process has served a DAP session already (debugpy starts once per process)"
    try:
        import debugpy  # noqa: F401
    except ImportError:
        return f"debugpy is not installed for {sys.executable} on this host (pip install 'tlaunch[debug]')"
    return None


def serve(
    sock: socket.socket,
    frame: FrameType,
    ended: Callable[[str], None],
    exception: BaseException | None = None,
) -> str | None:
    """Serve DAP for ``frame``'s thread over ``sock`` (the debugger's connection): the thread stops
    in pydevd at ``frame``'s line, or, for a post-mortem, at ``exception``'s frames (pydevd's own
    post-mortem: the traceback's frames, the exception shown), until the editor resumes it.

    Returns None once the editor has resumed the thread (``ended(why)`` is called when the editor
    leaves), else why DAP cannot be served (said to the debugger, whose pdb session goes on).
    """
    refused = unavailable()
    if refused is not None:
        return refused
    import debugpy

    ended = _once(ended)

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(1.0)
    came = threading.Event()

    def accept() -> None:  # pydevd's connection, from this process only; then relayed at once
        deadline = time.monotonic() + _ACCEPT
        try:
            while not came.is_set() and time.monotonic() < deadline:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not peer_is_this_process(conn):
                    conn.close()  # another process: never the node's debugger
                    continue
                came.set()
                listener.close()  # one connection: pydevd's
                relays = [
                    _no_trace(threading.Thread(target=copy_until_end, args=(a, b), name="tlaunch-dap-relay"))
                    for a, b in ((sock, conn), (conn, sock))
                ]
                for relay in relays:
                    relay.start()
                _watch(relays, sock, conn, ended)
        finally:
            listener.close()

    _no_trace(threading.Thread(target=accept, name="tlaunch-dap")).start()
    _served.append(True)
    sock.sendall(f"{READY}\n".encode())
    try:  # returns once the editor has configured the session (pydevd waits for it)
        debugpy.connect(("127.0.0.1", listener.getsockname()[1]))
    except Exception as exc:  # debugpy's own errors are not typed
        came.set()
        return f"debugpy could not start: {exc}"
    debugpy.wait_for_client()  # the editor has sent its configuration (configurationDone)
    if exception is not None:  # the node ends once resumed: its session is over then
        debugpy.trigger_exception_handler(exception, as_uncaught=False)
        ended("the editor let the node go on")
    else:
        _stop_here(frame)
    return None


def _once(call: Callable[[str], None]) -> Callable[[str], None]:
    """``call``, called the first time only (a session ends once, whoever says it first)."""
    done = threading.Lock()

    def first(why: str) -> None:
        if done.acquire(blocking=False):
            call(why)

    return first


def _stop_here(frame: FrameType) -> None:
    """Stop this thread in pydevd at ``frame``'s line (the one pdb stopped at, not run yet) until
    the editor resumes it; pydevd traces the frame and its callers from here (steps go on in it)."""
    import pydevd
    from _pydevd_bundle.pydevd_comm_constants import CMD_SET_BREAK

    debugger = pydevd.get_global_debugger()
    thread = threading.current_thread()
    debugger.set_trace_for_frame_and_parents(thread.ident, frame)
    debugger.set_suspend(thread, CMD_SET_BREAK)
    debugger.do_wait_suspend(thread, frame, "line", None)


def _watch(
    relays: list[threading.Thread], sock: socket.socket, pydevd: socket.socket, ended: Callable[[str], None]
) -> None:
    """Once either side has left: pydevd stops tracing (the node runs at full speed again), the
    connections close, and the session's end is told."""
    while all(r.is_alive() for r in relays):
        relays[0].join(0.5)
    with contextlib.suppress(Exception):  # an editor that left before configuring: stop waiting
        sys.modules["debugpy"].wait_for_client.cancel()
    with contextlib.suppress(Exception):  # pydevd's teardown raises what it likes
        sys.modules["pydevd"].stoptrace()
    from tlaunch.runtime import debugger

    debugger.install()  # breakpoint() is tlaunch's again (while an editor was there, it stopped in it)
    for s in (sock, pydevd):
        with contextlib.suppress(OSError):
            s.close()
    ended("the DAP session ended")
