"""A torch job's logs in the launcher: a file per worker and per agent, chosen ranks echoed live.

Agents relay each worker line as ``[w<local_rank>] text`` (or
``[w<local_rank>|<rank>] text`` when ranks change, as in torchrun mode). The
sink files it under ``<log_dir>/<run_id>/<host>[<local_rank>].log`` (the
agent's own lines under ``<host>.log``), echoes the lines of the chosen
global ranks as ``[host rank] text`` (any rank's line that says it waits for a debugger
too: :data:`~tlaunch.runtime.debugger.ANNOUNCEMENT`), and hands every line to the given
``logging.Handler``s as a record of logger ``tlaunch.torch.<host>[<local_rank>]``.
A program whose nodes are the workers themselves (basic mode) names each
node's host and ranks instead (``worker_of``).

The logs are private: the run's folder is 0700 (and so is ``log_dir`` when
tlaunch makes it), every file 0600.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from typing import IO

from tlaunch.runtime.debugger import ANNOUNCEMENT
from tlaunch.runtime.records import private_dirs

__all__ = ["JobLogs", "default_log_dir"]

_MARK = re.compile(r"^\[w(\d+)(?:\|(\d+))?\] ?(.*)$", re.DOTALL)


def default_log_dir() -> str:
    """``$TLAUNCH_LOG_DIR``, else ``./tlaunch_logs``."""
    return os.environ.get("TLAUNCH_LOG_DIR") or os.path.join(os.getcwd(), "tlaunch_logs")


class JobLogs:
    """The output sink of a torch job's launch (see the module docstring).

    Args:
        log_dir: where the run's folder of logs goes.
        run_id: the run's id (its folder's name).
        host_of: the host of an agent's prefix (``host agent/3`` or ``agent/3``), or None.
        rank_of: the global rank of (host, local rank) when lines do not carry it.
        echo_ranks: global ranks whose lines are echoed; None: none.
        echo_agents: also echo the agents' own lines.
        handlers: ``logging.Handler``s that get every line.
        stream: where echoed lines go (default: stdout).
        worker_of: the (host, local rank, rank) of a node that is a worker itself, by
            its prefix, or None (its lines are then read as an agent's).
    """

    def __init__(
        self,
        log_dir: str,
        run_id: str,
        host_of: Callable[[str], str | None],
        rank_of: Callable[[str, int], int | None],
        echo_ranks: Sequence[int] | None = (0,),
        echo_agents: bool = True,
        handlers: Sequence[logging.Handler] = (),
        stream: IO[str] | None = None,
        worker_of: Callable[[str], tuple[str, int, int] | None] | None = None,
    ) -> None:
        self.dir = os.path.join(log_dir, run_id)
        private_dirs(self.dir, top=os.path.abspath(log_dir))
        self._worker_of = worker_of
        self._host_of = host_of
        self._rank_of = rank_of
        self._echo = set(echo_ranks or ())
        self._echo_agents = echo_agents
        self._handlers = list(handlers)
        self._stream = stream
        self._files: dict[str, IO[str]] = {}
        self._lock = threading.Lock()

    def path(self, host: str, local_rank: int | None = None) -> str:
        """The log file of a worker (or, with no local rank, of the host's agent)."""
        name = f"{host}.log" if local_rank is None else f"{host}[{local_rank}].log"
        return os.path.join(self.dir, name)

    def line(self, prefix: str, text: str) -> None:
        """File (and maybe echo) one line of an agent's output (the :class:`OutputSink` protocol)."""
        worker = self._worker_of(prefix) if self._worker_of is not None else None
        if worker is not None:
            self._write(self.path(worker[0], worker[1]), text)
            self._emit(f"{worker[0]} {worker[2]}", text, worker[0], worker[1], echo=worker[2] in self._echo)
            return
        host = self._host_of(prefix)
        if host is None:  # the job's collector, or a node that is not an agent
            self._emit(prefix, text, None, None, echo=self._echo_agents)
            return
        m = _MARK.match(text)
        local_rank = rank = None
        if m:
            local_rank = int(m.group(1))
            rank = int(m.group(2)) if m.group(2) is not None else self._rank_of(host, local_rank)
            text = m.group(3)
        self._write(self.path(host, local_rank), text)
        if local_rank is None:
            self._emit(f"{host} agent", text, host, None, echo=self._echo_agents)
        else:
            label = f"{host} {rank}" if rank is not None else f"{host} local {local_rank}"
            self._emit(label, text, host, local_rank, echo=rank in self._echo)

    def _write(self, path: str, text: str) -> None:
        with self._lock:
            f = self._files.get(path)
            if f is None:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                f = self._files[path] = open(fd, "a", encoding="utf-8")  # noqa: SIM115
            f.write(text + "\n")
            f.flush()

    def _emit(self, label: str, text: str, host: str | None, local_rank: int | None, echo: bool) -> None:
        if echo or text.startswith(ANNOUNCEMENT):  # a paused rank is news whichever rank it is
            with self._lock:
                out = self._stream or sys.stdout
                out.write(f"[{label}] {text}\n")
                out.flush()
        if self._handlers:
            name = (
                "tlaunch.torch"
                if host is None
                else f"tlaunch.torch.{host}" + ("" if local_rank is None else f"[{local_rank}]")
            )
            record = logging.LogRecord(name, logging.INFO, "", 0, text, None, None)
            record.host = host
            record.local_rank = local_rank
            for h in self._handlers:
                if record.levelno >= h.level:
                    h.handle(record)

    def close(self) -> None:
        """Close every file."""
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
