"""Follow files on a host as they grow (``tail -F`` over one SSH channel)."""

from __future__ import annotations

import contextlib
import select
import threading
import uuid
from collections.abc import Callable

from tlaunch.errors import SSHError
from tlaunch.ssh.connection import Connection
from tlaunch.ssh.held import Held
from tlaunch.ssh.tailtext import TailText

__all__ = ["RemoteTail"]

_SETTLE = 0.1
"""Seconds a line waits for what follows it, which says whether tail cut it (:mod:`.tailtext`)."""


def _readable(chan: object, timeout: float) -> bool:
    """Whether ``chan`` (a paramiko channel: it has a ``fileno`` for this) has something to read,
    or has closed, within ``timeout`` seconds."""
    try:
        return bool(select.select([chan.fileno()], [], [], timeout)[0])  # type: ignore[attr-defined]
    except (OSError, ValueError):  # closed meanwhile: its recv says so
        return True


class RemoteTail:
    """Streams the lines of ``paths`` on ``conn``'s host to ``on_line(path, line)``.

    ``tail -F`` follows the files across rotation; ``stop()`` ends it (its shell
    ends its own process group), and with ``session`` it also ends by itself once that tmux
    session is gone, so nothing is left on the host. Its shell waits on the
    channel for one last command (:meth:`finish`: a run's cleanup, with no exec
    of its own), after which the tail ends.
    """

    def __init__(
        self,
        conn: Connection,
        paths: list[str],
        on_line: Callable[[str, str], None],
        from_start: bool = True,
        session: str | None = None,
        held: Held | None = None,
    ) -> None:
        self._conn = conn
        self.host = conn.host
        self._paths = paths
        # Several files: ``tail -v`` names each before its lines. One: no ``==> name <==`` header
        # (its own packet, ~0.3 ms of paramiko's CPU), and every line is that file's.
        self._headers = len(paths) > 1
        self._on_line = on_line
        self._start = "+1" if from_start else "0"
        self._session = session
        self._held = held  # a shell on the host waiting to become this tail (no exec of its own)
        self._pid: str | None = None
        self._pid_ready = threading.Event()
        self._end = f"tlaunch-end-{uuid.uuid4().hex}"  # the marks of finish()'s answer
        self._got = threading.Event()  # set when the host took finish()'s command, or the tail ended
        self._took = False
        self._answer: list[str] | None = None
        self._thread: threading.Thread | None = None
        self._chan: object = None

    def start(self, timeout: float = 30.0, wait: bool = True) -> None:
        """Start following (in a thread); returns once the host has answered (with ``wait``;
        else :meth:`check` says it later).

        Raises:
            SSHError: the exec failed, or the host said the tail could not start.
        """
        # Files are created first: GNU tail prints no header for a file that appears later.
        # With a session, the tail ends a second after that tmux session is gone (the run
        # ended there), so nothing outlives the run even if this side vanished: the watcher
        # signals its own process group (``kill 0``), never the tail by its pid (the tail may
        # have ended long before, on a closed channel, and its pid be another's by then). The
        # shell ignores that signal, from after its children started with the default. umask 077:
        # the logs it creates are the user's alone.
        # Then the shell waits on stdin for finish()'s command (its argument count, the drain,
        # each argument on a line): says it got it, runs it, lets the last lines come for the
        # drain, ends the tail (its whole process group but itself) and says the command's exit
        # status and output. Stdin's end (the launcher gone): the tail runs to the session's end.
        verbose = "-v " if self._headers else ""
        script = (
            'umask 077; S="$1"; N="$2"; E="$3"; shift 3; '
            'echo "$$"; for f; do [ -e "$f" ] || : >>"$f"; done; '
            f'tail {verbose}-n "$N" -F -s 0.2 -- "$@" 2>/dev/null & t=$!; w=""; '
            'if [ -n "$S" ]; then { while sleep 1 && tmux has-session -t "=$S" 2>/dev/null; do :; done; '
            'sleep 1; kill -s TERM 0; } </dev/null & w=$!; fi; trap "" TERM; '
            'if IFS= read -r n; then set --; while [ "$#" -lt "$n" ]; do IFS= read -r a || exit 1; '
            'set -- "$@" "$a"; done; D="$1"; shift; printf "\\n%s-got\\n" "$E"; '
            'out=$("$@" 2>&1); rc=$?; sleep "$D"; kill -s TERM 0 2>/dev/null; '
            'printf "\\n%s %s\\n%s" "$E" "$rc" "$out"; exit 0; fi; '
            'if [ -n "$w" ]; then wait $w; else wait $t; fi'
        )
        argv = ["sh", "-c", script, "sh", self._session or "", self._start, self._end, *self._paths]
        held, self._held = self._held, None
        chan = held.exec(argv) if held is not None else None
        self._chan = chan = chan or self._conn.stream(argv)
        self._thread = threading.Thread(target=self._read, args=(chan,), name="tlaunch-tail", daemon=True)
        self._thread.start()
        if wait:
            self.check(timeout)

    def check(self, timeout: float = 30.0) -> None:
        """Wait for the host to say the tail runs.

        Raises:
            SSHError: it said otherwise, or nothing within ``timeout`` s.
        """
        if self.wait_pid(timeout) is None:
            said = self._pid or "nothing"
            raise SSHError(self.host, f"following the logs failed: {said}")

    def finish(self, argv: list[str], drain: float = 0.0, reach: float = 3.0, timeout: float = 25.0) -> str:
        """Run ``argv`` in the tail's shell as its last command, then end the tail (``drain`` s
        after the command, for the last lines): one packet, no exec.

        Returns:
            What ``argv`` printed (stdout and stderr).

        Raises:
            ValueError: an argument holds a newline, or the tail is not running (or ended
                before it took the command).
            SSHError: the host did not take the command within ``reach`` s (its link is down),
                or it did not finish within ``timeout`` s.
        """
        thread, chan = self._thread, self._chan
        if thread is None or not thread.is_alive() or self.wait_pid(1.0) is None:
            raise ValueError(f"the log tail on {self.host} is not running")
        if not argv or any("\n" in a for a in argv):
            raise ValueError(f"{argv!r} cannot travel as lines")
        lines = [str(len(argv) + 1), f"{drain:.2f}", *argv]
        if chan.eof_received or chan.exit_status_ready():  # type: ignore[attr-defined]
            # Its shell ended, its channel not yet closed here: no write into a channel the host
            # closes (paramiko sends outside the channel's lock; a write that reaches sshd after
            # the channel is freed makes OpenSSH drop the whole connection, paramiko#1115).
            raise ValueError(f"the log tail on {self.host} ended")
        try:
            chan.sendall("".join(f"{a}\n" for a in lines).encode())  # type: ignore[attr-defined]
        except Exception as exc:  # its channel closed: the tail is gone
            raise ValueError(f"the log tail on {self.host} is gone ({exc or type(exc).__name__})") from exc
        if not self._got.wait(reach):
            raise SSHError(self.host, f"the host did not take the cleanup within {reach:.0f} s")
        if not self._took:  # it ended in the meantime: the caller runs the command otherwise
            raise ValueError(f"the log tail on {self.host} ended before it took the command")
        thread.join(timeout)
        if thread.is_alive() or self._answer is None:
            raise SSHError(self.host, f"the cleanup did not finish within {timeout:.0f} s")
        return "\n".join(self._answer)

    def _read(self, chan: object) -> None:
        text = TailText(self._paths[0] if self._paths else "", self._headers, self._on_line)
        buf = b""
        got, end = f"{self._end}-got", f"{self._end} "
        while True:
            if text.holding and not _readable(chan, _SETTLE):
                text.settle()  # nothing followed the last line: it was whole
                continue
            try:
                data = chan.recv(1 << 16)  # type: ignore[attr-defined]
            except OSError:
                break
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if self._answer is not None:
                    self._answer.append(line)
                elif line == got:  # a mark: its newline may have cut a line
                    text.mark()
                    self._took = True
                    self._got.set()
                elif line.startswith(end):
                    text.end()  # the tail has ended: what follows is the command's answer
                    self._answer = []
                elif self._pid is None:
                    self._pid = line.strip()  # its process group, or why it could not start
                    self._pid_ready.set()
                else:
                    text.line(line)
        if self._answer is not None:
            if buf:
                self._answer.append(buf.decode("utf-8", "replace"))
        else:
            text.end(buf.decode("utf-8", "replace"))
        self._pid_ready.set()
        self._got.set()

    def wait_pid(self, timeout: float) -> str | None:
        """The remote tail's process group, once it said it (None: not within ``timeout`` s)."""
        self._pid_ready.wait(timeout)
        return self._pid if self._pid and self._pid.isdigit() else None

    def running_group(self) -> str | None:
        """The tail's process group while its shell is known to run (its channel open), else
        None: a group that ended may have left its number to another."""
        thread = self._thread
        return self._pid if thread is not None and thread.is_alive() and self.wait_pid(0.0) else None

    def stop(self, drain: float = 0.5, kill: bool = True) -> None:
        """End the remote tail (after ``drain`` s for the last lines) and wait for the reader.

        Its shell ends its own process group, told on its channel (:meth:`finish`, with
        nothing to run): no exec, and no signal to a group that may have ended and its
        number gone to another. With ``kill=False`` (host unreachable) only the channel
        is closed; the tail ends with the host's sshd session.
        """
        held, self._held = self._held, None
        if held is not None:  # never started: the shell waiting to become it ends
            held.close()
        thread = self._thread
        if thread is None:
            return
        if kill and thread.is_alive() and self.wait_pid(5.0) is not None:
            try:
                self.finish(["true"], drain=drain, timeout=5.0)
            except (ValueError, SSHError):
                group = self.running_group()  # its shell still holds the group's number: the tail's
                if group is not None:
                    with contextlib.suppress(SSHError):
                        argv = ["sh", "-c", 'kill -- "-$1"', "sh", group]  # the shell's kill
                        self._conn.run(argv, check=False, timeout=5.0)
        elif drain:
            thread.join(drain)
        with contextlib.suppress(Exception):
            self._chan.close()  # type: ignore[attr-defined]
        thread.join(2.0)
        self._thread = None
