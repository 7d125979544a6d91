"""A host's shell kept on its channel after a script, to run the next command in its place.

:func:`run_held` runs a script and keeps its channel: once the script is done,
the host's shell waits there for a command (:meth:`Held.exec`) or for the word
that it may end (:meth:`Held.close`; a closed channel too). A command started
so costs no exec (a fork of sshd, a round trip, ~1 ms of paramiko's CPU here)
and reaches the host as one packet.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
import uuid
from typing import TYPE_CHECKING

import paramiko

from tlaunch.errors import SSHError
from tlaunch.rpc.readiness import wait_readable
from tlaunch.ssh.interrupt import WAIT_SLICE

if TYPE_CHECKING:
    from tlaunch.ssh.connection import Connection

__all__ = ["Held", "let_go_all", "run_held"]


def run_held(
    conn: Connection, script: str, args: list[str], timeout: float | None = None
) -> tuple[str, Held | None]:
    """Run ``sh -c SCRIPT sh ARGS...`` and keep its channel: once the script is done, the host's
    shell waits on it for the command to run in its place (:meth:`Held.exec`, :meth:`Held.close`).
    The script's own stderr is dropped.

    A later command started so costs no exec (a fork of sshd, a round trip, ~1 ms of
    paramiko's CPU here), and reaches the host as one packet.

    Returns:
        What the script printed on stdout, and the held channel (None if the script
        exited instead of waiting).

    Raises:
        SSHError: the connection broke, ``timeout`` passed, or the connection was interrupted.
    """
    mark = f"tlaunch-held-{uuid.uuid4().hex}"
    argv = ["sh", "-c", f"{{ {script}\n}} 2>/dev/null\n{_HOLD % mark}", "sh", *args]
    deadline = None if timeout is None else time.monotonic() + timeout
    out = bytearray()
    end = f"\n{mark}\n".encode()
    try:
        chan = conn.transport.open_session(timeout=timeout or 30.0)
        chan.exec_command(shlex.join(argv))
        while end not in out:
            if chan.recv_ready():
                out += chan.recv(1 << 16)
            elif chan.recv_stderr_ready():
                chan.recv_stderr(1 << 16)  # the login shell's, if any
            elif chan.eof_received or chan.closed:
                chan.close()
                return out.decode("utf-8", "replace"), None
            else:
                left = WAIT_SLICE if deadline is None else deadline - time.monotonic()
                wait_readable([chan, conn.interrupted], min(WAIT_SLICE, left))  # either wakes it
                if conn.interrupted.is_set():
                    chan.close()
                    raise SSHError(conn.host, "the command was interrupted")
                if deadline is not None and time.monotonic() > deadline:
                    chan.close()
                    raise SSHError(conn.host, f"the command did not finish within {timeout} s")
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise SSHError(conn.host, f"running a held command failed: {exc or type(exc).__name__}") from exc
    said = out[: out.index(end)].decode("utf-8", "replace")
    return said, Held(conn, chan)


# After a held script (run_held): say the mark, then read a command (its number of
# arguments, then each on a line) and exec it in this shell's place; nothing (0, or the channel
# closed): exit.
_HOLD = (
    'printf "\\n%%s\\n" "%s"; IFS= read -r n || exit 0; set --; '
    'while [ "$#" -lt "$n" ]; do IFS= read -r a || exit 0; set -- "$@" "$a"; done; '
    '[ "$#" -gt 0 ] || exit 0; exec "$@"'
)


class Held:
    """A host's shell waiting on an open channel for the command to run in its place
    (:func:`run_held`)."""

    def __init__(self, conn: Connection, chan: paramiko.Channel) -> None:
        self.host = conn.host
        self._chan: paramiko.Channel | None = chan
        self._lock = threading.Lock()

    def _take(self) -> paramiko.Channel | None:
        with self._lock:
            chan, self._chan = self._chan, None
        return chan

    def exec(self, argv: list[str]) -> paramiko.Channel | None:
        """Run ``argv`` in the waiting shell's place; its channel, its output and errors in one
        stream (as :meth:`Connection.stream`'s), or None if ``argv`` cannot travel this way (an
        argument with a newline: the shell is let go, run it as usual).

        Raises:
            SSHError: the channel broke.
        """
        chan = self._take()
        if chan is None:
            raise SSHError(self.host, "a held command was already used or let go")
        if not argv or any("\n" in a for a in argv):
            _let_go(chan)
            return None
        try:
            chan.set_combine_stderr(True)
            chan.sendall("".join(f"{a}\n" for a in [str(len(argv)), *argv]).encode())
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise SSHError(self.host, f"running {argv!r} failed: {exc or type(exc).__name__}") from exc
        return chan

    def close(self) -> None:
        """Let the waiting shell end (idempotent)."""
        chan = self._take()
        if chan is not None:
            _let_go(chan)


def let_go_all(held: dict[str, Held]) -> None:
    """Let every shell in ``held`` (by host) end, and forget them."""
    while held:
        held.popitem()[1].close()


def _let_go(chan: paramiko.Channel) -> None:
    """Tell a held shell there is nothing to run, and close its channel."""
    with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
        chan.sendall(b"0\n")
    chan.close()
