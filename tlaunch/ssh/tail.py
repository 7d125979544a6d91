"""Follow files on a host as they grow (``tail -F`` over one SSH channel)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from tlaunch.errors import SSHError
from tlaunch.ssh.connection import Connection
from tlaunch.ssh.held import Held

__all__ = ["RemoteTail"]


class RemoteTail:
    """Streams the lines of ``paths`` on ``conn``'s host to ``on_line(path, line)``.

    ``tail -F`` follows the files across rotation; ``stop()`` kills it by its
    process group, and with ``session`` it also ends by itself once that tmux
    session is gone, so nothing is left on the host.
    """

    def __init__(
        self,
        conn: Connection,
        paths: list[str],
        on_line: Callable[[str, str], None],
        from_start: bool = True,
        session: str | None = None,
        write_first: tuple[str, str] | None = None,
        held: Held | None = None,
    ) -> None:
        self._conn = conn
        self.host = conn.host
        self._paths = paths
        self._on_line = on_line
        self._start = "+1" if from_start else "0"
        self._session = session
        self._write = write_first
        self._held = held  # a shell on the host waiting to become this tail (no exec of its own)
        self._pid: str | None = None
        self._pid_ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._chan: object = None

    def start(self, timeout: float = 30.0, wait: bool = True) -> None:
        """Start following (in a thread); returns once the host has answered (with ``wait``;
        else :meth:`check` says it later).

        Raises:
            SSHError: the exec failed, or ``write_first`` could not be written.
        """
        # Files are created first: GNU tail prints no header for a file that appears later.
        # With a session, the tail ends a second after that tmux session is gone (the run
        # ended there), so nothing outlives the run even if this side vanished. umask 077:
        # what it creates (write_first, the logs) is the user's alone.
        script = (
            'umask 077; S="$0"; W="$1"; C="$2"; N="$3"; shift 3; '
            'if [ -n "$W" ]; then printf %s "$C" > "$W.part" && mv "$W.part" "$W" || '
            '{ echo "error: cannot write $W"; exit 1; }; fi; '
            'echo "$$"; for f; do [ -e "$f" ] || : >>"$f"; done; '
            'tail -v -n "$N" -F -s 0.2 -- "$@" 2>/dev/null & t=$!; '
            'if [ -n "$S" ]; then while tmux has-session -t "=$S" 2>/dev/null; do sleep 1; done; '
            "sleep 1; kill $t; else wait $t; fi"
        )
        write = self._write or ("", "")
        argv = ["sh", "-c", script, self._session or "", *write, self._start, *self._paths]
        held, self._held = self._held, None
        chan = held.exec(argv) if held is not None else None
        self._chan = chan = chan or self._conn.stream(argv)
        self._thread = threading.Thread(target=self._read, args=(chan,), name="tlaunch-tail", daemon=True)
        self._thread.start()
        if wait:
            self.check(timeout)

    def check(self, timeout: float = 30.0) -> None:
        """Wait for the host to say the tail runs (and ``write_first`` was written).

        Raises:
            SSHError: it said otherwise, or nothing within ``timeout`` s.
        """
        if self._write is not None and self.wait_pid(timeout) is None:
            said = self._pid or "nothing"
            raise SSHError(self.host, f"following the logs failed: {said}")

    def _read(self, chan: object) -> None:
        current = self._paths[0] if self._paths else ""
        pending_blank = False
        buf = b""
        while True:
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
                if self._pid is None:
                    self._pid = line.strip()  # its process group, or why it could not start
                    self._pid_ready.set()
                    continue
                if line.startswith("==> ") and line.endswith(" <=="):
                    current, pending_blank = line[4:-4], False
                    continue
                if pending_blank:
                    self._on_line(current, "")
                    pending_blank = False
                if not line:
                    pending_blank = True
                    continue
                self._on_line(current, line)
        self._pid_ready.set()

    def wait_pid(self, timeout: float) -> str | None:
        """The remote tail's process group, once it said it (None: not within ``timeout`` s)."""
        self._pid_ready.wait(timeout)
        return self._pid if self._pid and self._pid.isdigit() else None

    def stop(self, drain: float = 0.5, kill: bool = True) -> None:
        """Kill the remote tail (after ``drain`` s for the last lines) and wait for the reader.

        With ``kill=False`` (host unreachable) only the channel is closed; the
        tail ends with the host's sshd session.
        """
        held, self._held = self._held, None
        if held is not None:  # never started: the shell waiting to become it ends
            held.close()
        if self._thread is None:
            return
        if kill:
            self._pid_ready.wait(5.0)
        if drain:
            self._thread.join(drain)
        if kill and self._pid and self._pid.isdigit():
            with contextlib.suppress(SSHError):
                self._conn.run(["kill", "--", f"-{self._pid}"], check=False, timeout=5.0)
        with contextlib.suppress(Exception):
            self._chan.close()  # type: ignore[attr-defined]
        self._thread.join(2.0)
        self._thread = None
