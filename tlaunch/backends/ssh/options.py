"""The options of SSH launches (keyword arguments of :func:`tlaunch.launch`)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal

from tlaunch.backends.base import BackendOptions
from tlaunch.errors import LaunchError

__all__ = ["SSHOptions"]


@dataclass(frozen=True)
class SSHOptions(BackendOptions):
    """Options of SSH launches, beside the common ones (:class:`~tlaunch.options.LaunchOptions`).

    Attributes:
        ssh_config: ssh config file (default ``$TLAUNCH_SSH_CONFIG`` or ``~/.ssh/config``).
        accept_unknown_hosts: trust hosts missing from known_hosts (never a changed key).
        python: the interpreter on the hosts (default: the launcher's path), or a
            dict host -> interpreter.
        working_dir: a local folder shipped to every host; nodes start in it and
            import from it. What its ``.gitignore`` and ``.tlaunchignore`` files
            leave out is not shipped, nor are ``.git``, caches and virtualenvs.
            ``False``: a shared filesystem; nothing is shipped, nodes start in
            the launcher's working directory (its path, which preflight checks
            on every host).
        working_dir_limit_mib: refuse a ``working_dir`` that holds more than
            this to ship.
        ship_modules: ship the launcher's own Python modules (those beside the
            script or notebook, and any imported from outside the installed
            packages) to every host, on the nodes' ``PYTHONPATH``.
        shared_paths: with ``working_dir=False``, more paths that every host
            must see (a torch job's script); preflight checks them.
        setup: shell commands run once per host before its nodes (a list, or a
            dict host -> list), e.g. ``["bash setup.sh"]``.
        head_host: the host of the run's coordinator (default: the first host).
        heartbeat_timeout: a node whose supervisor is silent this long has failed.
        connect_timeout: seconds to reach and log in to each host.
        keep_bundles: leave each node's bundle file (``N.node``, ``head.pkl``; they
            hold the run's keys, mode 0600) and the shipped working dir on the
            hosts after the run, to inspect. Off by default:
            they are deleted as soon as read, and at teardown.
    """

    ssh_config: str | None = None
    accept_unknown_hosts: bool = False
    python: str | dict[str, str] | None = None
    working_dir: str | Literal[False] | None = None
    working_dir_limit_mib: float = 64.0
    ship_modules: bool = True
    shared_paths: tuple[str, ...] = ()
    setup: list[str] | dict[str, list[str]] | None = None
    head_host: str | None = None
    heartbeat_timeout: float = 10.0
    connect_timeout: float = 10.0
    keep_bundles: bool = False

    def check(self) -> None:
        wd: object = self.working_dir
        if wd is not False and not isinstance(wd, (str, type(None))):
            raise LaunchError(
                f"working_dir={self.working_dir!r}: give a folder to ship to every host, or False "
                "when every host shares this machine's filesystem (nothing is shipped)"
            )
        if isinstance(self.shared_paths, str) or any(not os.path.isabs(p) for p in self.shared_paths):
            raise LaunchError(f"shared_paths={self.shared_paths!r} must be a list of absolute paths")
        if self.heartbeat_timeout <= 0 or self.connect_timeout <= 0:
            raise LaunchError(
                f"heartbeat_timeout={self.heartbeat_timeout!r} and "
                f"connect_timeout={self.connect_timeout!r} must be > 0"
            )
        if isinstance(self.setup, str) or (
            isinstance(self.setup, dict) and any(isinstance(v, str) for v in self.setup.values())
        ):
            raise LaunchError(
                f"setup={self.setup!r} must be a list of shell commands (or a dict host -> list)"
            )

    def python_for(self, host: str) -> str:
        """The interpreter on ``host``."""
        if isinstance(self.python, dict):
            return self.python.get(host, sys.executable)
        return self.python or sys.executable

    def setup_for(self, host: str) -> list[str]:
        """The setup commands of ``host``."""
        if isinstance(self.setup, dict):
            return list(self.setup.get(host, []))
        return list(self.setup or [])
