"""A local Unix account a job runs as (a job server's ``--unix-users``), and the drop to it.

:class:`Account` is read from the system's user database (``pwd``, ``grp``):
its uid, primary gid, every supplementary group and home. :meth:`Account.drop`
is what a process started for that account is given: ``subprocess`` sets the
groups, the gid, then the uid in the child between ``fork`` and ``exec``
(``setgroups``, ``setresgid``, ``setresuid``), so what runs is that account's
from its first instruction: no shell, no ``sudo``, nothing that parses a
user's values. Only root can drop to another account.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import Any

from tlaunch.errors import LaunchError

__all__ = ["Account"]


@dataclass(frozen=True)
class Account:
    """A local account.

    Attributes:
        name: its login name.
        uid, gid: its user and primary group ids.
        groups: every group it is in (the primary one too).
        home: its home folder (``HOME``: its ``~/.ssh`` reaches its SSH hosts).
    """

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def named(cls, name: str) -> Account:
        """The account ``name``.

        Raises:
            LaunchError: this machine has no such account.
        """
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise LaunchError(f"{name!r} is not an account of this machine (getent passwd {name})") from None
        groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)

    def drop(self) -> dict[str, Any]:
        """``subprocess.Popen``'s arguments that start a process as this account (umask 077)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups), "umask": 0o077}

    def chown(self, path: str) -> None:
        """Give ``path`` (not what a link points to) to this account and its primary group."""
        os.lchown(path, self.uid, self.gid)
