"""An editor's session with a paused node: DAP on a local port (``tlaunch debug --dap``).

It attaches as :func:`tlaunch.control.debug.connect` does (the run's key; through the
cluster's port-forward on Kubernetes), asks the node's pdb for DAP, and serves the
node's pydevd on a loopback port of this machine for one editor (VS Code's
``"request": "attach", "connect": {"host": "127.0.0.1", "port": P}``, or any DAP client)::

    from tlaunch import control
    from tlaunch.control import dap

    bridge = dap.open_bridge(control.find_run("trainer-2026"), "learner/0", port=5678)
    print(bridge.address)     # 127.0.0.1:5678
    bridge.serve()            # until the editor leaves (the node goes on)

The port takes one connection, from a process of this machine's user only (the
kernel says whose socket is at the other end: :mod:`tlaunch.runtime.debugger.peers`);
another user's is closed at once. Raises :class:`~tlaunch.errors.DebugError`; prints nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from tlaunch.backends.handle import RunHandle
from tlaunch.control.debug import Attached, connect
from tlaunch.errors import DebugError
from tlaunch.runtime.debugger.dap import COMMAND, READY
from tlaunch.runtime.debugger.peers import peer_uid
from tlaunch.sockets import copy_until_end

__all__ = ["Bridge", "DapRefused", "open_bridge"]

_ANSWER_WAIT = 30.0


class DapRefused(DebugError):
    """The node cannot serve DAP (no debugpy on its host, its process served one already); it still waits, and
    ``session`` is its pdb, at its prompt (closing it lets the node go on).

    Attributes:
        session: the open pdb session.
    """

    def __init__(self, message: str, session: Attached) -> None:
        super().__init__(message)
        self.session = session


class Bridge:
    """A loopback port of this machine that is the paused node's DAP endpoint (see the module docstring).

    Attributes:
        address: ``127.0.0.1:PORT``.
        session: the debugger's connection to the node.
        refused: connections refused so far (another user's).
    """

    def __init__(self, session: Attached, port: int) -> None:
        self.session = session
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.bind(("127.0.0.1", port))
        except OSError as exc:
            self._listener.close()
            raise DebugError(
                f"cannot listen on 127.0.0.1:{port} ({exc}): give another --port, or 0"
            ) from None
        self._listener.listen(4)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.refused = 0

    def serve(self) -> None:
        """Take the editor's connection (this user's only) and relay it to the node until either ends."""
        try:
            while True:
                editor, _ = self._listener.accept()
                if peer_uid(editor) == os.getuid():
                    break
                self.refused += 1
                editor.close()
        finally:
            self._listener.close()
        node = self.session.sock
        relays = [
            threading.Thread(target=copy_until_end, args=(a, b), name="tlaunch-dap-relay", daemon=True)
            for a, b in ((editor, node), (node, editor))
        ]
        for relay in relays:
            relay.start()
        try:
            while all(r.is_alive() for r in relays):
                relays[0].join(0.5)
        finally:
            editor.close()
            self.session.close()

    def close(self) -> None:
        """Stop listening and end the session (the node goes on); idempotent."""
        with contextlib.suppress(OSError):
            self._listener.close()
        self.session.close()


def open_bridge(handle: RunHandle, node: str, port: int = 0, *, wait: float = 0.0) -> Bridge:
    """Attach to node ``node``, turn its session into DAP, and listen on ``127.0.0.1:port`` (0: any).

    Raises:
        KeyError: the run has no such node.
        DapRefused: it cannot serve DAP (no debugpy on its host...): its pdb session is open.
        DebugError: it is not paused, cannot be reached, or refused the key: the message says which.
    """
    session = connect(handle, node, wait=wait)
    try:
        refused = _ask_for_dap(session)
        if refused is not None:
            raise DapRefused(f"node {node} cannot serve DAP: {refused}", session)
        return Bridge(session, port)
    except DapRefused:
        raise
    except BaseException:
        session.close()
        raise


def _ask_for_dap(session: Attached) -> str | None:
    """Send pdb the DAP command at its prompt and read its answer: None once :data:`READY` came (DAP
    follows), else why not (pdb's error; its prompt has come again, the session goes on)."""
    sock = session.sock
    sock.settimeout(_ANSWER_WAIT)
    said = b""
    try:
        while not said.endswith(b"(Pdb) "):
            chunk = sock.recv(4096)
            if not chunk:
                raise DebugError(f"the node ended the session: {said.decode(errors='replace').strip()}")
            said += chunk
        sock.sendall(f"{COMMAND}\n".encode())
        said = b""
        while READY.encode() not in said:
            chunk = sock.recv(1)  # one byte at a time: what follows the line is pydevd's
            if not chunk:
                raise DebugError(f"the node ended the session: {said.decode(errors='replace').strip()}")
            said += chunk
            if said.endswith(b"(Pdb) "):  # pdb said why not, and prompts again
                return said.decode(errors="replace").replace("(Pdb) ", "").replace("*** ", "").strip()
        while not said.endswith(b"\n"):
            said += sock.recv(1)
    except TimeoutError:
        raise DebugError(f"node {session.node.node} did not answer in {_ANSWER_WAIT:.0f} s") from None
    finally:
        sock.settimeout(None)
    return None
