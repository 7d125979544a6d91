"""The nodes' output on the launcher's terminal: one ``tail -F`` a host over its SSH connection."""

from __future__ import annotations

import threading

from tlaunch.backends.base import OutputSink
from tlaunch.backends.ssh.hostside import run_dir_of
from tlaunch.backends.tmux import session_of
from tlaunch.plan import log_name
from tlaunch.ssh import Connection, Held, pmap
from tlaunch.ssh.tail import RemoteTail

__all__ = ["LogStreams"]


class LogStreams:
    """The log tails of one run's hosts, each line to the sink prefixed ``host label/i``."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._tails: dict[str, RemoteTail] = {}  # by host: one a host
        self._lock = threading.Lock()

    def follow(
        self,
        conn: Connection,
        keys: list[str],
        sink: OutputSink,
        held: Held | None = None,
        wait: bool = True,
    ) -> RemoteTail | None:
        """Follow the logs of nodes ``keys`` (those on ``conn``'s host).

        ``held``: the host's shell waiting to become the tail (no exec of its own).
        With ``wait`` false, the caller waits for the host's answer (:meth:`RemoteTail.check`).

        Returns:
            The tail, or None if the host has no nodes (``held`` is left as it is).

        Raises:
            SSHError: the exec failed.
        """
        host = conn.host
        logs = f"{run_dir_of(self.run_id)}/logs"
        by_file = {f"{logs}/{log_name(key)}": key for key in keys}
        if not by_file:
            return None

        def on_line(path: str, line: str) -> None:
            sink.line(f"{host} {by_file.get(path, path)}", line)

        tail = RemoteTail(conn, list(by_file), on_line, session=session_of(self.run_id), held=held)
        with self._lock:
            self._tails[host] = tail  # before it starts: a stop must find it
        tail.start(wait=wait)
        return tail

    def of(self, host: str) -> RemoteTail | None:
        """``host``'s tail, if it has one."""
        with self._lock:
            return self._tails.get(host)

    def stop(self, reachable: set[str] | None = None, drain: float = 0.5) -> None:
        """Stop following (``drain`` s for the last lines); only hosts in ``reachable`` are asked to kill."""
        with self._lock:
            tails, self._tails = self._tails, {}

        def stop(host: str) -> None:
            tails[host].stop(drain=drain, kill=reachable is None or host in reachable)

        if tails:
            pmap(stop, list(tails))
