"""A host's shell kept on its channel after a script, to run the next commands there.

:func:`run_held` runs a script and keeps its channel: once the script is done,
the host's shell waits there for commands: one to run with a counted stdin,
after which it waits again (:meth:`Held.run`), one to run in its place
(:meth:`Held.exec`), or the word that it may end (:meth:`Held.close`; a closed
channel too). A command started so costs no exec (a fork of sshd, a round trip,
~1 ms of paramiko's CPU here) and reaches the host as one packet.
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
from tlaunch.ssh.interrupt import end_fed, feed, wait_channel, wait_ended

if TYPE_CHECKING:
    from tlaunch.ssh.connection import Connection

__all__ = ["Held", "let_go_all", "run_held"]


def run_held(
    conn: Connection, script: str, args: list[str], timeout: float | None = None, scratch: str | None = None
) -> tuple[str, Held | None]:
    """Run ``sh -c SCRIPT sh ARGS...`` and keep its channel: once the script is done, the host's
    shell waits on it for the command to run in its place (:meth:`Held.exec`, :meth:`Held.close`).
    The script's own stderr is dropped. What it puts in ``$R`` is said just before the
    mark, in the same write: one packet, where each line printed on its own may be one
    (~0.3 ms of paramiko's CPU each, on the launcher).

    A later command started so costs no exec (a fork of sshd, a round trip, ~1 ms of
    paramiko's CPU here), and reaches the host as one packet.

    ``scratch`` (a path relative to the shell's directory, the home directory): what the
    shell removes as it ends, unless a command told it to keep it (:meth:`Held.run`'s
    ``keep_scratch``). Files written there before the launch is sure to go on (a host's
    files, unpacked while other hosts are checked) go with the shell: when the launcher
    lets it go, and when the launcher's connection drops (its process killed).

    Returns:
        What the script printed on stdout, and the held channel (None if the script
        exited instead of waiting).

    Raises:
        SSHError: the connection broke, ``timeout`` passed, or the connection was interrupted.
    """
    mark = f"tlaunch-held-{uuid.uuid4().hex}"
    if scratch is not None and (
        not scratch.strip("/.") or scratch.startswith("/") or ".." in scratch.split("/")
    ):
        raise ValueError(f"scratch {scratch!r} must be a path below the home directory")
    keep = "" if scratch is None else shlex.quote(scratch)
    argv = ["sh", "-c", f"R=; U={keep}; {{ {script}\n}} 2>/dev/null\n{_HOLD % mark}", "sh", *args]
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
            elif why := wait_channel(chan, conn.interrupted, deadline):
                chan.close()
                said = "was interrupted" if why == "interrupted" else f"did not finish within {timeout} s"
                raise SSHError(conn.host, f"the command {said}")
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise SSHError(conn.host, f"running a held command failed: {exc or type(exc).__name__}") from exc
    said = out[: out.index(end)].decode("utf-8", "replace")
    return said, Held(conn, chan, mark)


# After a held script (run_held): say what it put in $R and the mark, then read commands, each its number of
# arguments, then each on a line. "bLEN" before them: run it with the next LEN bytes as its
# stdin (all of them read, whatever it reads: the rest is drained by the shell's own ``read``,
# no exec of ``cat``), say the mark and its exit status, and wait again (``head -c`` reads no
# more than LEN bytes: GNU's; "b0": stdin is /dev/null, no ``head``); else exec it in this
# shell's place; nothing (0, or the channel closed): exit. A number "sN" in place of N: the
# first argument is a shell script, run in a subshell of this shell with the others as its "$@"
# (``sh -c`` without an exec of ``sh``); in this shell's place, it runs in this shell itself,
# which then exits. A line "k" before them: keep the scratch path ``$U``,
# which the shell otherwise removes as it ends (``q``; ``[`` and ``test`` are built in).
_HOLD = (
    'M="%s"; q() { [ -n "$U" ] && [ -e "$U" ] && rm -rf -- "$U"; exit 0; }; '
    'printf "%%s\\n%%s\\n" "$R" "$M"; while IFS= read -r n; do L=""; S=""; '
    'case "$n" in k) U=; IFS= read -r n || q;; esac; '
    'case "$n" in b*) L="${n#b}"; IFS= read -r n || q;; esac; '
    'case "$n" in s*) S=1; n="${n#s}";; esac; set --; '
    'while [ "$#" -lt "$n" ]; do IFS= read -r a || q; set -- "$@" "$a"; done; '
    '[ "$#" -gt 0 ] || q; '
    'if [ -z "$L" ]; then [ -z "$S" ] || { S=$1; shift; eval "$S"; exit; }; exec "$@"; fi; '
    'if [ "$L" = 0 ]; then { if [ -n "$S" ]; then (S=$1; shift; eval "$S"); else "$@"; fi; } '
    "</dev/null 2>&1; else "
    'head -c "$L" | { if [ -n "$S" ]; then (S=$1; shift; eval "$S"); else "$@"; fi; s=$?; '
    "while IFS= read -r _ 2>/dev/null; do :; done; exit $s; } 2>&1; fi; "
    'printf "\\n%%s %%s\\n" "$M" "$?"; done; q'
)


class Held:
    """A host's shell waiting on an open channel for the command to run in its place
    (:func:`run_held`)."""

    def __init__(self, conn: Connection, chan: paramiko.Channel, mark: str) -> None:
        self.host = conn.host
        self._conn = conn
        self._chan: paramiko.Channel | None = chan
        self._mark = mark
        self._lock = threading.Lock()
        self._pending: tuple[list[str], bool] | None = None  # the command sent (and whether it was fed)
        self._out = bytearray()  # what the shell said and no command took yet
        self.counted_stdin = False
        """Whether the host's ``head -c`` reads no more than it is asked (GNU's; BusyBox's reads
        ahead): :meth:`run` needs it, its caller says (preflight asks)."""

    def can_run(self, argv: list[str], stdin: bool = True) -> bool:
        """Whether :meth:`run` can run ``argv``: no argument holds a newline (each travels as a
        line), and, for a command given a ``stdin``, the host's ``head`` counts."""
        return (self.counted_stdin or not stdin) and bool(argv) and not any("\n" in a for a in argv)

    def run(
        self, argv: list[str], stdin: bytes = b"", timeout: float | None = None, keep_scratch: bool = False
    ) -> tuple[int, str]:
        """Run ``argv`` with ``stdin`` in the waiting shell, which waits again afterwards.

        ``["sh", "-c", SCRIPT, NAME, *ARGS]`` runs SCRIPT in a subshell of the waiting shell
        (no exec of ``sh``): ``"$@"`` is ARGS, as in ``sh -c``, but ``$$`` and ``$0`` are the
        waiting shell's, and so are its variables (``M``, ``L``, ``S``, ``n``, ``a``, ``U``): a
        script sets what it reads. ``keep_scratch``: the shell keeps its scratch path
        (:func:`run_held`) from now on, whatever happens next.

        Returns:
            Its exit status and its output (stdout and stderr, as they came).

        Raises:
            ValueError: an argument holds a newline (it cannot travel as a line), or the
                host's ``head`` was not said to count (:attr:`counted_stdin`).
            SSHError: the channel broke, ``timeout`` passed or the connection was interrupted
                (the shell is let go: :meth:`exec` and :meth:`run` raise from then on).
        """
        self.send(argv, stdin, keep_scratch)
        return self.finish(timeout)

    def send(self, argv: list[str], stdin: bytes = b"", keep_scratch: bool = False) -> None:
        """Start :meth:`run`'s command without waiting for it to end: :meth:`finish` says how
        it ended (the launcher goes on meanwhile; another host's work, say).

        Raises:
            ValueError, SSHError: as :meth:`run`'s.
        """
        if not self.can_run(argv, stdin=bool(stdin)):
            raise ValueError(f"{argv!r} cannot run in the held shell on {self.host}")
        with self._lock:
            chan = self._chan
        if chan is None:
            raise SSHError(self.host, "a held command was already used or let go")
        if self._pending is not None:
            raise SSHError(self.host, f"{self._pending[0]!r} was started and not finished")
        # ``sh -c SCRIPT NAME ARGS...`` runs as SCRIPT in a subshell of the held shell: no exec.
        head = "".join(f"{a}\n" for a in ["k"] * keep_scratch + [f"b{len(stdin)}", *_lines(argv)]).encode()
        self._pending = (argv, bool(stdin))
        try:
            if self._conn.interrupted.is_set():  # cut short before it starts: nothing runs
                raise SSHError(self.host, f"{argv!r} was interrupted")
            if not feed(chan, stdin, self._conn.interrupted, lead=head):  # files shipped: cut short
                raise SSHError(self.host, f"{argv!r} was interrupted")
        except BaseException as exc:
            self._give_up(exc)
            raise

    def finish(self, timeout: float | None = None) -> tuple[int, str]:
        """How the command :meth:`send` started ended: its exit status and its output.

        Raises:
            SSHError: as :meth:`run`'s (nothing was started: the shell was let go).
        """
        with self._lock:
            chan = self._chan
        if chan is None or self._pending is None:
            raise SSHError(self.host, "no held command was started, or the shell was let go")
        argv = self._pending[0]
        deadline = None if timeout is None else time.monotonic() + timeout
        out = self._out
        end = f"\n{self._mark} ".encode()
        try:
            while True:
                at = out.find(end)
                if at >= 0 and out.find(b"\n", at + len(end)) >= 0:
                    nl = out.index(b"\n", at + len(end))
                    status = out[at + len(end) : nl].decode()
                    said = out[:at].decode("utf-8", "replace")
                    del out[: nl + 1]
                    self._pending = None
                    return int(status), said
                if chan.recv_ready():
                    out += chan.recv(1 << 16)
                elif chan.recv_stderr_ready():
                    chan.recv_stderr(1 << 16)  # the shell's own (a head that failed)
                elif chan.eof_received or chan.closed:
                    raise SSHError(self.host, f"the held shell ended while running {argv!r}")
                elif why := wait_channel(chan, self._conn.interrupted, deadline):
                    said = "was interrupted" if why == "interrupted" else f"did not finish within {timeout} s"
                    raise SSHError(self.host, f"{argv!r} {said}")
        except BaseException as exc:
            self._give_up(exc)
            raise

    def _give_up(self, exc: BaseException) -> None:
        """The started command failed on our side: let the shell go, its command ended first;
        a transport's error becomes an :class:`SSHError` (raised from here)."""
        argv, fed = self._pending or ([], False)
        if fed and (chan := self._take()) is not None:
            end_fed(chan)  # what it unpacks ends before the cleanup that follows begins
        self.close()  # its input cut short: the shell reads EOF, the command ends, so does it
        if isinstance(exc, (paramiko.SSHException, OSError, EOFError)):
            raise SSHError(self.host, f"running {argv!r} failed: {exc or type(exc).__name__}") from exc

    def _take(self) -> paramiko.Channel | None:
        with self._lock:
            chan, self._chan = self._chan, None
        return chan

    def exec(self, argv: list[str]) -> paramiko.Channel | None:
        """Run ``argv`` in the waiting shell's place; its channel, its output and errors in one
        stream (as :meth:`Connection.stream`'s), or None if ``argv`` cannot travel this way (an
        argument with a newline: the shell is let go, run it as usual). ``["sh", "-c", SCRIPT,
        NAME, *ARGS]`` runs SCRIPT in the waiting shell itself (no exec of ``sh``; ``$0`` is the
        shell's), which exits once SCRIPT is done.

        Raises:
            SSHError: the channel broke.
        """
        chan = self._take()
        if chan is None:
            raise SSHError(self.host, "a held command was already used or let go")
        if not argv or any("\n" in a for a in argv):
            _let_go(chan)
            return None
        # ``sh -c SCRIPT NAME ARGS...`` runs as SCRIPT in this very shell (``$0`` is the shell's).
        try:
            chan.set_combine_stderr(True)
            chan.sendall("".join(f"{a}\n" for a in _lines(argv)).encode())
        except (paramiko.SSHException, OSError, EOFError) as exc:
            chan.close()
            raise SSHError(self.host, f"running {argv!r} failed: {exc or type(exc).__name__}") from exc
        return chan

    def close(self) -> None:
        """Let the waiting shell end (idempotent)."""
        chan = self._take()
        if chan is not None:
            _let_go(chan)


LET_GO_WAIT = 5.0
"""How long :func:`let_go_all` waits at most for the shells it lets go to end."""


def _lines(argv: list[str]) -> list[str]:
    """``argv`` as the held shell reads it (:data:`_HOLD`): its argument count, then each
    argument on a line; ``["sh", "-c", SCRIPT, NAME, *ARGS]`` as ``sN``, SCRIPT and ARGS (the
    shell runs SCRIPT itself, with no exec of ``sh``)."""
    if len(argv) >= 4 and argv[:2] == ["sh", "-c"]:
        return [f"s{len(argv) - 3}", argv[2], *argv[4:]]
    return [str(len(argv)), *argv]


def let_go_all(held: dict[str, Held], wait: float = LET_GO_WAIT) -> None:
    """Let every shell in ``held`` (by host) end, and forget them: told all at once, then each
    waited for (``wait`` seconds in all at most) so that what it removes as it ends (its
    scratch path) is gone when this returns."""
    chans = []
    while held:
        chan = held.popitem()[1]._take()
        if chan is not None:
            chans.append(chan)
            _tell_end(chan)
    until = time.monotonic() + wait
    for chan in chans:
        wait_ended(chan, until)
        chan.close()


def _tell_end(chan: paramiko.Channel) -> None:
    """Tell a held shell there is nothing to run, and end its input."""
    with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
        chan.sendall(b"0\n")
        chan.shutdown_write()


def _let_go(chan: paramiko.Channel) -> None:
    """Tell a held shell there is nothing to run, and close its channel."""
    _tell_end(chan)
    chan.close()
