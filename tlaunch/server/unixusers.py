"""``tlaunch server --unix-users``: each user of the token file is a local account, and their jobs run as it.

The server runs as root. Its home, and what is whose::

    <home>/                      root, 0711: each user can reach their own folder, list none
    <home>/server/               root, 0700: the database, the package store, the handoff area
    <home>/users/                root, 0711
    <home>/users/<user>/         the user's, 0700: their TLAUNCH_HOME (runs; environments built on SLURM)
    <home>/users/.handoff/       root, 0711: a job's package copy, made by root, given to the user
    <home>/users/.envs/          root, 0711: the users' runtime environments on this machine
    <home>/users/.envs/<user>/   root, 0700, and the user may read it (ACL u:<user>:r-x): theirs,
                                 sealed: root's files, read-only (:mod:`tlaunch.server.envstore`)
    <home>/users/.envs/.sealer   root's socket: a job's launcher asks it for an environment

Every account is checked at start (:meth:`UnixUsers.check`): it exists, it is
not root, and it can run the server's Python (a folder on the way that it
cannot enter, ``/root`` for a pyenv build, is named). The token file must be
root's alone. A job's own copy of its package is made where only root can
enter, given to the user, and moved into the user's run folder by a process
of the user's (:mod:`tlaunch.control.starting.handoff`): root never writes in
a folder a user could have put a link in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable

from tlaunch.accounts import Account
from tlaunch.errors import LaunchError

__all__ = ["UnixUsers", "check_token_file"]


def check_token_file(path: str | None) -> None:
    """Refuse a token file that is not root's (whoever owns it is every user of the server).

    Raises:
        ValueError: it is owned by another account.
    """
    if path is not None and os.stat(path).st_uid != 0:
        raise ValueError(f"{path} must be owned by root under --unix-users (its owner could be any user): "
                         f"chown root {path}")  # fmt: skip


def _account(name: str) -> Account:
    if name.startswith("."):  # the server's own folders beside the users' are named so
        raise LaunchError(f"the user {name!r} of the token file starts with '.': give another account")
    account = Account.named(name)
    if account.uid == 0:
        raise LaunchError(
            f"the user {name!r} of the token file is root: its jobs would run as root; give that token to "
            "an account of its own"
        )
    return account


class UnixUsers:
    """The accounts of the server's users, and their folders under ``home``.

    Raises:
        LaunchError: the server is not root, or a user is not an account of this machine, or is root.
    """

    def __init__(self, home: str, names: Iterable[str]) -> None:
        if os.geteuid() != 0:
            raise LaunchError(
                "--unix-users needs the server to run as root (it starts each user's jobs as that user's "
                "own account); run it as root, or without --unix-users for one account"
            )
        self.home = home
        self.accounts: dict[str, Account] = {}
        for name in sorted(set(names)):
            self.accounts[name] = _account(name)
        self.users = os.path.join(home, "users")
        self.handoff = os.path.join(self.users, ".handoff")
        self.envs = os.path.join(self.users, ".envs")
        self.sealer = os.path.join(self.envs, ".sealer")
        """The socket of the users' runtime environments (:mod:`tlaunch.server.envstore`)."""

    def account(self, name: str) -> Account:
        """User ``name``'s account; a user the token file gained since the start is checked, and
        their folder made, now.

        Raises:
            LaunchError: ``name`` is not an account of this machine, or is root.
        """
        if name not in self.accounts:
            account = _account(name)
            self._make_home(name, account)
            self.accounts[name] = account
        return self.accounts[name]

    def home_of(self, name: str) -> str:
        """User ``name``'s ``TLAUNCH_HOME``."""
        return os.path.join(self.users, name)

    def envs_of(self, name: str) -> str:
        """User ``name``'s runtime environments on this machine (root's, readable by the user only)."""
        return os.path.join(self.envs, name)

    def homes(self) -> list[str]:
        """Every user's ``TLAUNCH_HOME``."""
        return [self.home_of(name) for name in self.accounts]

    def check(self) -> None:
        """Refuse an account that cannot run the server's Python, or reach its folder (once made).

        Raises:
            LaunchError: naming the account, and what stands in its way.
        """
        for name, account in self.accounts.items():
            home, envs = self.home_of(name), self.envs_of(name)
            done = subprocess.run(
                [sys.executable, "-c", f"import os, tlaunch; os.listdir({home!r}); os.listdir({envs!r})"],
                capture_output=True,
                text=True,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": account.home},
                cwd="/",
                timeout=60,
                check=False,
                **account.drop(),
            )
            said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            if done.returncode != 0 and home in said:
                raise LaunchError(
                    f"the account {account.name!r} cannot reach its folder {home} ({said}): every folder "
                    f"above {self.home} must let others through (chmod o+x), or choose another --home"
                )
            if done.returncode != 0 and envs in said:
                raise LaunchError(
                    f"the account {account.name!r} cannot read {envs} ({said}), which its ACL entry lets "
                    "it: --home must be on a filesystem that honours ACLs"
                )
            if done.returncode != 0:
                raise LaunchError(
                    f"the account {account.name!r} cannot run {sys.executable} with tlaunch ({said}): "
                    "install the server where every user can read it (not under /root)"
                )

    def prepare(self) -> None:
        """Make the folders of the module docstring, with their owners and modes.

        Raises:
            LaunchError: ``setfacl`` is missing, this filesystem takes no ACL, or ``home`` is too long a path.
        """
        if len(os.fsencode(self.sealer)) > 107:  # a Unix socket's path (sun_path) holds 108 bytes
            raise LaunchError(f"--home {self.home} is too long a path for the socket {self.sealer} (at most "
                              "107 bytes): choose a shorter --home")  # fmt: skip
        if shutil.which("setfacl") is None:
            raise LaunchError(
                "--unix-users needs setfacl (each user may read their own runtime environments, root's "
                "files: an ACL entry): install the acl package (apt-get install acl)"
            )
        os.chmod(self.home, 0o711)
        for folder in (self.users, self.handoff, self.envs):
            os.makedirs(folder, mode=0o711, exist_ok=True)
            os.chown(folder, 0, 0)
            os.chmod(folder, 0o711)
        for name, account in self.accounts.items():
            self._make_home(name, account)

    def _make_home(self, name: str, account: Account) -> None:
        path = self.home_of(name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        os.lchown(path, account.uid, account.gid)
        os.chmod(path, 0o700)
        envs = self.envs_of(name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(envs, 0o700)
        os.lchown(envs, 0, 0)
        os.chmod(envs, 0o700)  # first: a chmod after the ACL would mask its entry
        done = subprocess.run(["setfacl", "-m", f"u:{account.uid}:rx", envs], capture_output=True, text=True,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            raise LaunchError(
                f"cannot let {name!r} read {envs} (setfacl: {done.stderr.strip()}): --home must be on a "
                "filesystem with ACLs"
            )

    def handoff_dir(self) -> str:
        """A new folder only root can enter, for a job's package copy before it is given to its user."""
        return tempfile.mkdtemp(prefix="job-", dir=self.handoff)
