"""How the server starts a job: in a run folder of its own, from its own copy of the package, clean.

::

    POST /v1/trainer/job ─▶ answered (PENDING) ─▶ Launches ─▶ Starter.start(row, store, package, run_id)
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
from dataclasses import replace

from tlaunch import control
from tlaunch.accounts import Account
from tlaunch.control.runs import runs_dir
from tlaunch.control.starting.accountrun import AccountRun
from tlaunch.control.starting.handoff import PACKAGE_DIR, adopt_as, submit_as
from tlaunch.control.starting.jobenv import job_environ
from tlaunch.control.starting.sealedenv import SEALER_VARIABLE
from tlaunch.errors import RunNotFoundError
from tlaunch.plan import new_run_id
from tlaunch.runtime.records import private_dirs
from tlaunch.server.jobs import handle_of, job_of
from tlaunch.server.packages import Package, PackageStore
from tlaunch.server.store import JobRow
from tlaunch.server.unixusers import UnixUsers

__all__ = ["PACKAGE_DIR", "Starter"]


class Starter:
    """Starts the server's jobs (see the module docstring).

    Args:
        home: the server's ``TLAUNCH_HOME`` (its jobs' run store).
        job_env: names (patterns) of the server's environment its jobs get too.
        unix: ``--unix-users``: each user's account and home (None: every job as the server's account).
        environ: the server's environment (default: this process's).
    """

    def __init__(
        self,
        home: str,
        job_env: Sequence[str] = (),
        unix: UnixUsers | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.home = home
        self.job_env = tuple(job_env)
        self.unix = unix
        self._environ = os.environ if environ is None else environ
        own = pwd.getpwuid(os.getuid())
        self._own = Account(own.pw_name, own.pw_uid, own.pw_gid, (), own.pw_dir)

    def home_of(self, owner: str) -> str:
        """The ``TLAUNCH_HOME`` of ``owner``'s jobs (their run store)."""
        return self.unix.home_of(owner) if self.unix is not None else self.home

    def homes(self) -> list[str]:
        """Every run store of the server's jobs."""
        return self.unix.homes() if self.unix is not None else [self.home]

    def account_of(self, owner: str) -> Account:
        """The account ``owner``'s jobs run as."""
        return self.unix.account(owner) if self.unix is not None else self._own

    def environ(self, owner: str) -> dict[str, str]:
        """What ``owner``'s job's launcher starts with: never the server's own environment."""
        account = self.account_of(owner)
        env = job_environ(
            self._environ,
            home=self.home_of(owner),
            user=account.name,
            user_home=account.home,
            keep=self.job_env,
        )
        if self.unix is not None:  # its runtime environment from the server's sealed store
            env[SEALER_VARIABLE] = self.unix.sealer
        return env

    def handle(self, row: JobRow) -> control.RunHandle | None:
        """The handle of ``row``'s run, if the run store knows it (see :meth:`adopt`)."""
        handle = handle_of(row, self.home_of(row.owner))
        return None if handle is None else self.adopt(self.home_of(row.owner), handle)

    def adopt(self, home: str, handle: control.RunHandle) -> control.RunHandle:
        """``handle`` of a run of the store ``home``, to be read and stopped as its user's account needs:
        under ``--unix-users`` a run on SSH hosts is reached with its user's own SSH identity
        (:class:`~tlaunch.control.starting.accountrun.AccountRun`)."""
        if self.unix is None or not getattr(handle, "uses_ssh_identity", False):
            return handle
        owner = os.path.basename(home)
        return AccountRun(handle, self.unix.account(owner), home, self.environ(owner))

    def find_run(self, run_id: str) -> control.RunHandle:
        """The run ``run_id`` of the server's jobs, in whichever run store has it (see :meth:`adopt`).

        Raises:
            RunNotFoundError: no store has it.
        """
        for home in self.homes():
            try:
                return self.adopt(home, control.attach(*control.find_record(run_id, home)))
            except RunNotFoundError:
                continue
        raise RunNotFoundError(f"no run {run_id!r}")

    def start(
        self, row: JobRow, store: PackageStore, package: Package, run_id: str | None = None
    ) -> control.RunHandle:
        """Start ``row``'s job from its own copy of ``package``; its run's handle.

        Args:
            run_id: the run's id (default: a new one): a job server keeps it first, and finds the run
                again under it if it is killed before this returns (:mod:`tlaunch.server.launches`).

        Raises:
            ChangedPackage: the stored package was changed on disk (nothing started).
            TLaunchError: the job could not start (the message says why; nothing of it is left).
        """
        run_id = run_id or new_run_id(row.name)
        if self.unix is not None:
            return self._start_as(row, store, package, self.unix, run_id)
        run_dir = os.path.join(runs_dir(self.home), run_id)
        private_dirs(run_dir, top=self.home)
        try:
            folder = store.checkout(package, os.path.join(run_dir, PACKAGE_DIR))
            job, target = job_of(row, package, folder)
            # started_in: the job's ./tlaunch-models is in its own folder, never the server's
            return control.submit(
                job, target, home=self.home, environ=self.environ(row.owner), run_id=run_id, started_in=folder
            )
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise

    def _start_as(
        self, row: JobRow, store: PackageStore, package: Package, unix: UnixUsers, run_id: str
    ) -> control.RunHandle:
        """``--unix-users``: the copy made where only root enters, given to the user; the job submitted by
        a process of the user's (:func:`~tlaunch.control.starting.handoff.submit_as`)."""
        account, home = unix.account(row.owner), unix.home_of(row.owner)
        if row.spec.get("kubernetes") is not None:
            return self._start_on_kubernetes(row, store, package, unix, run_id)
        folder = os.path.join(runs_dir(home), run_id, PACKAGE_DIR)
        job, target = job_of(row, package, folder)
        assert isinstance(target, control.Hosts | control.Slurm)
        handoff = unix.handoff_dir()
        try:
            copy = store.checkout(package, os.path.join(handoff, PACKAGE_DIR), chown=account.chown)
            account.chown(handoff)
            submit_as(account, job, target, home=home, environ=self.environ(row.owner), run_id=run_id,
                      package=copy, started_in=folder)  # fmt: skip
        finally:
            shutil.rmtree(handoff, ignore_errors=True)
        return self.adopt(home, control.find_run(run_id, home))

    def _start_on_kubernetes(
        self, row: JobRow, store: PackageStore, package: Package, unix: UnixUsers, run_id: str
    ) -> control.RunHandle:
        """``--unix-users`` on Kubernetes: the LPJob created as the user (the API server impersonates
        them: their RBAC decides, in their namespace), its run recorded where only root enters, then
        given to the user and moved into their run store by a process of theirs."""
        account, home = unix.account(row.owner), unix.home_of(row.owner)
        handoff = unix.handoff_dir()
        try:
            copy = store.checkout(package, os.path.join(handoff, PACKAGE_DIR))  # packed into its Secret
            job, target = job_of(row, package, copy)
            assert isinstance(target, control.Kubernetes)
            target = replace(target, impersonate=account.name)
            control.submit(job, target, home=handoff, run_id=run_id)
            recorded = os.path.join(runs_dir(handoff), run_id)
            for top, dirs, files in os.walk(recorded):
                for name in (*dirs, *files):
                    account.chown(os.path.join(top, name))
            for path in (recorded, runs_dir(handoff), handoff):
                account.chown(path)
            adopt_as(account, recorded, home=home, run_id=run_id, environ=self.environ(row.owner))
        finally:
            shutil.rmtree(handoff, ignore_errors=True)
        return self.adopt(home, control.find_run(run_id, home))
