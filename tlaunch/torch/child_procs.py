"""An agent's child processes: started in their own process group, output relayed line by line, killed whole.

Each line a child prints goes to the agent's stdout as ``[w<tag>] line``, so the
launcher (:mod:`tlaunch.torch.logs`) can file it under its worker and the
host's node log keeps every worker's output in order; the last lines are kept
for the error report of a child that dies.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

__all__ = ["Child", "kill_all", "relay_line"]

_OUT_LOCK = threading.Lock()
_PF_EXITING = 0x4  # a task's flag (/proc/<pid>/stat) from the start of its exit


def relay_line(tag: str, text: str) -> None:
    """Print ``text`` as a line of child ``tag`` (``[w<tag>] text``) on the agent's stdout."""
    with _OUT_LOCK:
        sys.stdout.write(f"[w{tag}] {text}\n")
        sys.stdout.flush()


class Child:
    """One child process of an agent.

    Args:
        argv: what to run.
        env: its whole environment.
        tag: how its lines are marked (``0``, ``3|5``: local rank, or local and global rank).
        stdin: give it a pipe on stdin (to send it its layout later).
        relay: relay its output; False: it writes to the agent's stdout itself (its
            lines already carry their own ``[w...]`` marks).
        cwd: its working directory.
        death_signal: what the child gets when the agent's thread that started it dies
            (``PR_SET_PDEATHSIG``, set by :mod:`tlaunch.torch.deathsig` before it execs
            ``argv``): an agent killed with SIGKILL leaves no worker behind. Per-host
            launchers get SIGTERM, on which they end their own ranks.
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        tag: str,
        *,
        stdin: bool = False,
        relay: bool = True,
        cwd: str | None = None,
        death_signal: int = signal.SIGKILL,
    ) -> None:
        self.tag = tag
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.started = time.time()
        """When it was started (it was running from then on, until it is seen ended)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tlaunch.torch.deathsig", str(int(death_signal)), str(os.getpid()), *argv],
            env=dict(env),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE if relay else None,
            stderr=subprocess.STDOUT if relay else None,
            start_new_session=True,  # its own process group: killed whole, never by a terminal's ^C
            cwd=cwd,
        )
        self._reader: threading.Thread | None = None
        if relay:
            self._reader = threading.Thread(target=self._relay, name=f"tlaunch-relay-{tag}", daemon=True)
            self._reader.start()

    def _relay(self) -> None:
        out = self.proc.stdout
        assert out is not None
        for raw in iter(out.readline, b""):
            text = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(text)
            relay_line(self.tag, text)
        out.close()

    def send(self, data: bytes) -> None:
        """Write ``data`` to the child's stdin and close it (a child that died first is ignored)."""
        if self.proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.write(data)
            self.proc.stdin.close()

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self.proc.poll()

    def exiting(self) -> bool:
        """Whether it has begun to exit though it cannot be reaped yet (Linux; elsewhere False).

        Its main thread's ``PF_EXITING`` is set before its sockets close: a peer in a
        collective sees it gone ("connection reset") before :meth:`poll` says so, while
        its other threads end (a torch process has many).
        """
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)
        except (OSError, ValueError, IndexError):
            return False  # gone (reaped: poll says so), or no /proc

    def drain(self, timeout: float = 2.0) -> None:
        """Wait (a little) for its last output to be relayed."""
        if self._reader is not None:
            self._reader.join(timeout)

    def log_tail(self, n: int = 20) -> str:
        """Its last ``n`` lines of output."""
        return "\n".join(list(self.tail)[-n:])

    def signal(self, sig: int) -> None:
        """Send ``sig`` to its whole process group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def kill_all(children: Sequence[Child], grace: float = 1.0) -> None:
    """SIGTERM every child's process group, SIGKILL what is left after ``grace`` seconds; reap them all."""
    for c in children:
        if c.poll() is None:
            c.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(c.poll() is None for c in children) and time.monotonic() < deadline:
        time.sleep(0.02)
    for c in children:
        c.signal(signal.SIGKILL)  # the group: grandchildren too, even when the child itself is gone
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(5)
        c.drain(1.0)
