"""An SSH run found again from its record: :class:`SSHRun` (``tlaunch ps/logs/stop/attach``, the job server).

An SSH run outlives its launcher once detached: its coordinator runs on the
head host, its logs stay on each host, and its final state is the head's
``final.json``. This handle reaches the coordinator with the keys of the
local record, the hosts over SSH (logs, the final state, the tmux windows,
teardown), and records the end when it sees it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tlaunch.backends.handle import LogLine
from tlaunch.backends.recorded import RecordedRun
from tlaunch.backends.ssh.hostside import run_dir_of
from tlaunch.errors import CommandError, LaunchError, SSHError, StopError
from tlaunch.plan import log_name
from tlaunch.runtime.records import RunRecord, launcher_alive, mark_ended, read_keys
from tlaunch.runtime.remote import RemoteCoordinator
from tlaunch.ssh import connect_all
from tlaunch.ssh.tail import RemoteTail

__all__ = ["Reattached", "SSHRun"]


class _TailFollower:
    """The hosts' tails of a run's logs, stepped through (:class:`~tlaunch.backends.logfiles.LogSteps`)."""

    def __init__(
        self,
        tails: list[RemoteTail],
        lines: queue.Queue[LogLine],
        conns: dict[str, Any],
        more: Callable[[], list[RemoteTail]],
    ) -> None:
        self.tails, self.lines, self.conns, self.more = tails, lines, conns, more
        self.closed = False
        self.listed, self.every = time.monotonic(), 1.0

    def read(self, last: bool = False) -> list[LogLine]:
        if not self.closed and (last or self.relist_due()):  # logs that appeared since (nodes starting)
            self.listed = time.monotonic()
            with contextlib.suppress(KeyError, SSHError, CommandError):
                new = self.more()
                self.tails += new
                self.every = 1.0 if new else min(8.0, self.every * 2)
        if last and not self.closed:
            for tail in self.tails:
                tail.stop(drain=1.0)  # what the hosts wrote before the end comes first
        out = []
        while True:
            try:
                out.append(self.lines.get_nowait())
            except queue.Empty:
                break
        if last and not self.closed:
            self.closed = True
            self._close()
        return out

    def relist_due(self) -> bool:
        return not self.closed and time.monotonic() - self.listed > self.every

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        threading.Thread(target=self._close, name="close log tails", daemon=True).start()  # never waits

    def _close(self) -> None:
        for tail in self.tails:
            with contextlib.suppress(Exception):
                tail.stop(drain=0.0)
        for conn in self.conns.values():
            conn.close()


class Reattached(Protocol):
    """What the stop of a detached run needs of the SSH backend found again (``attach_ssh``)."""

    coord: RemoteCoordinator | None

    def stop(self, grace: float) -> None: ...


class SSHRun(RecordedRun):
    """A run on SSH hosts, seen from this machine's record of it (see the module docstring)."""

    outlives_launcher = True
    uses_ssh_identity = True

    def __init__(self, run_dir: str, record: RunRecord, reattach: Callable[..., Reattached]) -> None:
        super().__init__(run_dir, record)
        self._reattach = reattach
        """``(run_dir, record, keys) -> backend``: the SSH backend of a running run, found again."""

    def _final_elsewhere(self, rec: RunRecord) -> dict[str, Any] | None:
        """The head's ``final.json`` of a run whose coordinator has exited."""
        head = rec.head or rec.hosts[0]
        try:
            conn = connect_all([head], ssh_config=rec.ssh_config)[head]
        except Exception:  # the host cannot be reached: nothing more to learn now
            return None
        try:
            data: dict[str, Any] = json.loads(conn.read_file(f"{run_dir_of(rec.run_id)}/final.json"))
            return data
        except (SSHError, ValueError):
            return None
        finally:
            conn.close()

    def logs(self, node: str | None = None, *, follow: bool = False) -> Iterator[LogLine]:
        """The nodes' log lines from their hosts (node ``node``'s only); with ``follow``, until it ends.

        Raises:
            KeyError: no host has a log of node ``node``.
            SSHError: a host cannot be reached.
        """
        rec = self.record
        if rec.preparing:  # its launcher's own log (the runtime environment's build) comes first
            return self._logs_from_the_start(node, follow)
        keys = {log_name(k): k for k in self._node_keys()}
        conns = connect_all(rec.hosts, ssh_config=rec.ssh_config)
        try:
            tails, lines = self._start_tails(rec, conns, keys, node)
        except BaseException:
            for conn in conns.values():
                conn.close()
            raise
        return self._drain(tails, lines, conns, follow)

    def log_follower(self, node: str | None = None) -> _TailFollower | None:
        """The nodes' logs on their hosts to follow step by step (None while the run is being
        prepared: its launcher's log comes first, then the hosts': follow :meth:`logs`).

        Raises:
            KeyError: no host has a log of node ``node``.
            SSHError: a host cannot be reached.
        """
        rec = self.record
        if rec.preparing:
            return None
        conns = connect_all(rec.hosts, ssh_config=rec.ssh_config)
        tailed: set[tuple[str, str]] = set()
        lines: queue.Queue[LogLine] = queue.Queue()

        def more() -> list[RemoteTail]:  # the logs of nodes that started since (a run just starting)
            keys = {log_name(k): k for k in self._node_keys()}
            return self._start_tails(self.record, conns, keys, node, lines, tailed)[0]

        try:
            tails = more()
        except BaseException:
            for conn in conns.values():
                conn.close()
            raise
        return _TailFollower(tails, lines, conns, more)

    def _logs_from_the_start(self, node: str | None, follow: bool) -> Iterator[LogLine]:
        local = os.path.join(self.run_dir, "logs")
        yield from self._local_logs(
            local, node, follow, lambda: not self.record.preparing or self.snapshot().ended
        )
        if not follow or self.record.preparing:  # not started (yet, or ever): no host has logs
            return
        # Then the hosts' logs, whole, even when the run has ended meanwhile (a short job does).
        try:
            lines = self.logs(node, follow=True)
        except KeyError:
            if not self.snapshot().ended:
                raise
            return  # it ended before any node wrote a log
        yield from lines

    def _start_tails(
        self,
        rec: RunRecord,
        conns: dict[str, Any],
        keys: dict[str, str],
        node: str | None,
        lines: queue.Queue[LogLine] | None = None,
        tailed: set[tuple[str, str]] | None = None,
    ) -> tuple[list[RemoteTail], queue.Queue[LogLine]]:
        """Tails of the run's logs on its hosts (those not in ``tailed`` yet: it gets them), into ``lines``.

        Raises:
            KeyError: no log of node ``node`` on any host (and none tailed before).
        """
        log_dir = f"{run_dir_of(rec.run_id)}/logs"
        lines = queue.Queue() if lines is None else lines
        tailed = set() if tailed is None else tailed
        tails = []
        # A node placed on a host has its log there, once its supervisor starts: a run that is
        # starting may not have made it yet (the tail makes it, and follows it from the start).
        placed: dict[str, set[str]] = {}
        for n in rec.graph:
            if n.get("host") and n.get("key"):
                placed.setdefault(str(n["host"]), set()).add(log_name(str(n["key"])))
        if rec.head:
            placed.setdefault(rec.head, set()).add("coordinator.log")
        for host, conn in conns.items():
            listing = conn.run(["ls", "-1", log_dir], check=False).stdout.split()
            names = sorted(
                n
                for n in {*listing, *placed.get(host, ())}
                if n.endswith(".log")
                and (node is None or keys.get(n, n[:-4]) == node)
                and (host, n) not in tailed
            )
            if not names:
                continue
            tailed.update((host, n) for n in names)

            def on_line(path: str, line: str, host: str = host) -> None:
                name = os.path.basename(path)
                lines.put(LogLine(keys.get(name, name[:-4]), line, host, f"{host} {name[:-4]}"))

            paths = [f"{log_dir}/{n}" for n in names]
            tail = RemoteTail(conn, paths, on_line, session=f"tlaunch-{rec.run_id}")
            tail.start()
            tails.append(tail)
        if not tailed:
            whose = f"node {node!r}" if node else "any node"
            raise KeyError(f"no log of {whose} on {', '.join(rec.hosts)} in ~/{log_dir}")
        return tails, lines

    def _drain(
        self,
        tails: list[RemoteTail],
        lines: queue.Queue[LogLine],
        conns: dict[str, Any],
        follow: bool,
    ) -> Iterator[LogLine]:
        try:
            checked = time.monotonic()
            while follow:
                try:
                    line: LogLine | None = lines.get(timeout=0.25)
                except queue.Empty:
                    line = None
                if line is not None:
                    yield line
                if time.monotonic() - checked > 0.5:
                    checked = time.monotonic()
                    if self.snapshot().ended:
                        break
            for tail in tails:
                tail.stop(drain=1.0)
            while not lines.empty():
                yield lines.get_nowait()
        finally:
            for tail in tails:
                with contextlib.suppress(Exception):
                    tail.stop(drain=0.0)
            for conn in conns.values():
                conn.close()

    def _stop_without_launcher(self) -> None:
        """Tear down an SSH run that no launcher holds: stop, confirm each host, record the end."""
        rec = self.record
        backend = self._reattach(self.run_dir, rec, read_keys(self.run_dir))
        coord = backend.coord
        assert coord is not None
        left: StopError | None = None
        try:
            backend.stop(grace=coord.stop_grace())
        except StopError as exc:
            left = exc
        failure = coord.failure
        mark_ended(
            self.run_dir,
            rec,
            {
                "status": coord.status(),
                "stop_reason": coord.stop_reason,
                "stop_kind": coord.stop_kind,
                "failure": None if failure is None else dataclasses.asdict(failure),
            },
        )
        if left is not None:
            raise left

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the run: its launcher tears it down or, when detached, this process does.

        Raises:
            StopError: a process of the run outlived its kill (the error names them by host).
        """
        if self.snapshot().ended:
            return
        if self.record.preparing:  # no coordinator yet: its launcher ends the preparation
            super().stop(timeout)
            return
        if launcher_alive(self.record) is False:  # None: another machine's, which ends it when asked
            self._stop_without_launcher()
            return
        super().stop(timeout)

    def attach_argv(self, node: str | None = None) -> list[str]:
        """``ssh -t HOST tmux attach`` to the node's window (default: the run's coordinator).

        Raises:
            LaunchError: the run has ended, or has no node ``node``.
        """
        snap = self.snapshot()
        rec = self.record
        if snap.ended:
            raise LaunchError(f"run {rec.run_id} has ended; its logs: `tlaunch logs {rec.run_id}`")
        session = f"tlaunch-{rec.run_id}"
        host, window = rec.head or rec.hosts[0], "coordinator"
        if node is not None:
            try:
                host, window = snap.node(node).host, node
            except KeyError as exc:
                raise LaunchError(str(exc.args[0])) from None
        argv = ["ssh", "-t"]
        if rec.ssh_config:
            argv += ["-F", rec.ssh_config]
        # Select the window by name inside tmux: names may hold characters tmux targets do not allow.
        remote = (
            f"tmux select-window -t {shlex.quote('=' + session + ':=' + window)} 2>/dev/null || "
            f'tmux select-window -t "$(tmux list-windows -t {shlex.quote("=" + session)} '
            f"-F '#{{window_index}} #{{window_name}}' | awk -v w={shlex.quote(window)} "
            '\'substr($0, index($0, " ") + 1) == w {print $1}\')"; '
            f"exec tmux attach -t {shlex.quote('=' + session)}"
        )
        return [*argv, host, remote]
