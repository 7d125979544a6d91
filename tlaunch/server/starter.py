"""How the server starts a job: in a run folder of its own, from its own copy of the package, clean.

::

    POST /v1/trainer/job ─▶ Starter.start(row, store, package)
        run id chosen ─▶ <home>/runs/<run id>/package/   the job's copy, each file checked against the
                                                         hash it was stored with (ChangedPackage if not)
        job_of(row, package, that copy) ─▶ control.submit(job, target, environ=clean, run_id=...)

The job's working directory is its copy: what it writes there (a checkpoint, an
edited script) stays in its run's folder; the stored package and every other
job of the same bytes are untouched. Its launcher starts with
:func:`~tlaunch.control.starting.jobenv.job_environ`'s environment, never the
server's.
"""

from __future__ import annotations

import os
import pwd
import shutil
from collections.abc import Mapping, Sequence

from tlaunch import control
from tlaunch.control.runs import runs_dir
from tlaunch.control.starting.jobenv import job_environ
from tlaunch.plan import new_run_id
from tlaunch.runtime.records import private_dirs
from tlaunch.server.jobs import job_of
from tlaunch.server.packages import Package, PackageStore
from tlaunch.server.store import JobRow

__all__ = ["PACKAGE_DIR", "Starter"]

PACKAGE_DIR = "package"
"""A job's copy of its package, in its run's folder (its working directory on this machine)."""


class Starter:
    """Starts the server's jobs (see the module docstring).

    Args:
        home: the server's ``TLAUNCH_HOME`` (its jobs' run store).
        job_env: names (patterns) of the server's environment its jobs get too.
        environ: the server's environment (default: this process's).
    """

    def __init__(
        self, home: str, job_env: Sequence[str] = (), environ: Mapping[str, str] | None = None
    ) -> None:
        self.home = home
        self.job_env = tuple(job_env)
        self._environ = os.environ if environ is None else environ
        self._account = pwd.getpwuid(os.getuid())

    def environ(self) -> dict[str, str]:
        """What a job's launcher starts with: never the server's own environment."""
        return job_environ(
            self._environ,
            home=self.home,
            user=self._account.pw_name,
            user_home=self._account.pw_dir,
            keep=self.job_env,
        )

    def start(self, row: JobRow, store: PackageStore, package: Package) -> control.RunHandle:
        """Start ``row``'s job from its own copy of ``package``; its run's handle.

        Raises:
            ChangedPackage: the stored package was changed on disk (nothing started).
            TLaunchError: the job could not start (the message says why; nothing of it is left).
        """
        run_id = new_run_id(row.name)
        run_dir = os.path.join(runs_dir(self.home), run_id)
        private_dirs(run_dir, top=self.home)
        try:
            folder = store.checkout(package, os.path.join(run_dir, PACKAGE_DIR))
            job, target = job_of(row, package, folder)
            return control.submit(job, target, home=self.home, environ=self.environ(), run_id=run_id)
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
