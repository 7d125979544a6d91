"""A run of another local account's, as a server running as root sees it (``--unix-users``).

Root reads a run's record, state and local logs itself. What needs the
account's own SSH identity, its ``~/.ssh`` (a run on SSH hosts: its logs there,
a stop once its launcher is gone), is done by a process of the account
(``python -m tlaunch.control.starting.handoff logs|stop``, dropped to it as
:func:`~.handoff.submit_as` is), whose output this relays: root never logs in
to a host as a user, and never holds a user's key.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping

from tlaunch.accounts import Account
from tlaunch.backends.handle import LogLine, RunHandle, RunSnapshot
from tlaunch.errors import LaunchError
from tlaunch.runtime.results import JobResult

__all__ = ["AccountRun"]

_HANDOFF = [sys.executable, "-m", "tlaunch.control.starting.handoff"]


class AccountRun:
    """``handle`` (a run of ``account``'s, recorded in its ``TLAUNCH_HOME`` ``home``): its logs and its
    stop through a process of the account (see the module docstring), the rest as it is."""

    def __init__(self, handle: RunHandle, account: Account, home: str, environ: Mapping[str, str]) -> None:
        self.handle = handle
        self.account = account
        self.home = home
        self.environ = dict(environ)

    @property
    def run_id(self) -> str:
        """tlaunch's id of the run."""
        return self.handle.run_id

    @property
    def backend(self) -> str:
        """The backend's name."""
        return self.handle.backend

    def snapshot(self) -> RunSnapshot:
        """Its state now."""
        return self.handle.snapshot()

    def results(self) -> JobResult | None:
        """How its job ended (None: not yet, or no job)."""
        return self.handle.results()

    def join(self, timeout: float | None = None) -> RunSnapshot:
        """Block until it has ended; its final snapshot (see :meth:`RunHandle.join`)."""
        return self.handle.join(timeout)

    def _start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*_HANDOFF, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.environ,
            cwd=self.home,
            **self.account.drop(),
        )

    def logs(self, node: str | None = None, *, follow: bool = False) -> Iterator[LogLine]:
        """Its log lines, read by a process of the account; with ``follow``, until it ends.

        Raises:
            KeyError: the run has no node ``node``.
            LaunchError: the account's process could not read them.
        """
        proc = self._start("logs", self.home, self.run_id, node or "", "follow" if follow else "once")
        assert proc.stdout is not None
        try:
            for text in proc.stdout:
                data = json.loads(text)
                if "missing" in data:
                    raise KeyError(data["missing"])
                if "error" in data:
                    raise LaunchError(
                        f"reading the logs of run {self.run_id} as {self.account.name!r}: {data['error']}"
                    )
                yield LogLine(data["node"], data["text"], data["host"], data["where"])
        finally:  # a reader that left (a client gone) ends the account's process too
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()
            proc.wait()

    def stop(self) -> None:
        """Stop the run, through a process of the account.

        Raises:
            LaunchError: it could not be stopped (the account's process says why).
        """
        proc = self._start("stop", self.home, self.run_id)
        out, _ = proc.communicate(timeout=120)
        said = json.loads((out.strip().splitlines() or ["{}"])[-1])
        if "stopped" not in said:
            raise LaunchError(
                f"stopping run {self.run_id} as {self.account.name!r}: {said.get('error', out)}"
            )
