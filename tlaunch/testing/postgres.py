"""A real PostgreSQL server for tests: a private cluster in a temporary folder, on loopback.

::

    with PostgresTestServer() as pg:
        url = pg.create_database("jobs")      # postgresql://postgres@127.0.0.1:PORT/jobs

Debian's ``postgresql`` package (``/usr/lib/postgresql/<version>/bin``):
``initdb`` a cluster owned by the ``postgres`` user (PostgreSQL refuses to
run as root; when this process is not root it runs as itself), trust
authentication on 127.0.0.1 and a socket in the cluster's folder, ``pg_ctl``
start and stop. Nothing is left: the server is stopped (fast, then by pid)
and the folder removed on exit.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType

__all__ = ["PostgresTestServer", "postgres_bin"]


def postgres_bin() -> str | None:
    """The newest PostgreSQL's ``bin`` folder of this machine, if one is installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return os.path.dirname(found[-1]) if found else None


class PostgresTestServer:
    """A PostgreSQL cluster of its own (see the module docstring)."""

    def __init__(self) -> None:
        bin_dir = postgres_bin()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql")
        self.bin = bin_dir
        self.root = tempfile.mkdtemp(prefix="tlaunch-pg-")
        self.data = os.path.join(self.root, "data")
        self.port = _free_port()
        self._user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name
        self._pid: int | None = None
        self._made = 0

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run(
            [*prefix, *argv], capture_output=True, text=True, timeout=120, check=True, cwd=self.root
        )

    def __enter__(self) -> PostgresTestServer:
        try:
            if os.geteuid() == 0:
                entry = pwd.getpwnam("postgres")
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._run(f"{self.bin}/initdb", "-D", self.data, "-U", self._user, "--auth=trust", "-E", "UTF8")
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
            log = os.path.join(self.root, "server.log")
            self._run(f"{self.bin}/pg_ctl", "-D", self.data, "-l", log, "-o", options, "-w", "start")
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                self._pid = int(f.readline())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def create_database(self, prefix: str = "db") -> str:
        """A new, empty database; its URL."""
        self._made += 1
        name = f"{prefix}_{self._made}"
        self._run(f"{self.bin}/createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self._user, name)
        return f"postgresql://{self._user}@127.0.0.1:{self.port}/{name}"

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if os.path.isdir(self.data) and self._pid is not None:
            try:
                self._run(f"{self.bin}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                _kill(self._pid)
            deadline = time.monotonic() + 10
            while _alive(self._pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
