"""Local Unix accounts made for a test and removed after it (``useradd``, ``userdel``): needs root.

::

    with TestAccounts("alice", "bob") as accounts:
        accounts["alice"].name       # tl-1a2b3c-alice: a real account, its own group and home
        accounts["alice"].uid

Each account gets its own group (``--user-group``) and home (``/home/<name>``,
0700), no password (``*``: it logs in over SSH with a key of its own only),
and can run this Python: a folder on the way to the interpreter that others
cannot enter (``/root`` for a pyenv build) gets an ACL entry letting the
account through (``setfacl -m u:NAME:x``; needs the ``acl`` package), taken
off again at the end. At the end every process of the accounts is killed,
then the accounts, their groups and homes are removed.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
from types import TracebackType

from tlaunch.accounts import Account

__all__ = ["TestAccounts", "accounts_unavailable"]


def accounts_unavailable() -> str | None:
    """Why test accounts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "test accounts need root (useradd)"
    missing = [t for t in ("useradd", "userdel", "setfacl") if shutil.which(t) is None]
    if missing:
        return f"test accounts need {', '.join(missing)} (apt-get install passwd acl)"
    return None


def _closed_folders(path: str) -> list[str]:
    """The folders on the way to ``path`` that others cannot enter."""
    out, folder = [], os.path.dirname(os.path.realpath(path))
    while True:
        if not os.stat(folder).st_mode & 0o001:
            out.append(folder)
        if folder == "/":
            return out[::-1]
        folder = os.path.dirname(folder)


class TestAccounts:
    """Accounts named ``tl-<random>-<short>`` for each short name; a context manager."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self, *short: str) -> None:
        reason = accounts_unavailable()
        if reason:
            raise RuntimeError(reason)
        tag = secrets.token_hex(3)
        self.names = {s: f"tl-{tag}-{s}" for s in short}
        self._made: list[str] = []
        self._acl: list[tuple[str, str]] = []
        self.accounts: dict[str, Account] = {}

    def __getitem__(self, short: str) -> Account:
        return self.accounts[short]

    def __enter__(self) -> TestAccounts:
        try:
            for short, name in self.names.items():
                # password '*': none can be given, yet the account is not locked ('!'), which sshd
                # without PAM would take as a refusal of its keys too
                subprocess.run(
                    [
                        "useradd",
                        "--create-home",
                        "--user-group",
                        "--shell",
                        "/bin/sh",
                        "--password",
                        "*",
                        name,
                    ],
                    check=True,
                    capture_output=True,
                )
                self._made.append(name)
                account = Account.named(name)
                os.chmod(account.home, 0o700)
                self.accounts[short] = account
                for folder in _closed_folders(sys.executable):
                    subprocess.run(["setfacl", "-m", f"u:{name}:x", folder], check=True, capture_output=True)
                    self._acl.append((folder, name))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def pids(self) -> list[int]:
        """The processes of the accounts that run now (not the ones that ended, waiting to be reaped)."""
        uids = {a.uid for a in self.accounts.values()}
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{entry}").st_uid in uids:
                        with open(f"/proc/{entry}/stat") as f:
                            state = f.read().rpartition(")")[2].split()[0]
                        if state != "Z":
                            found.append(int(entry))
        return found

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        deadline = time.monotonic() + 10
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for folder, name in self._acl:
            subprocess.run(["setfacl", "-x", f"u:{name}", folder], check=False, capture_output=True)
        for folder in {folder for folder, _ in self._acl}:  # as it was: no mask once no one is named
            entries = subprocess.run(["getfacl", "-c", folder], check=False, capture_output=True, text=True)
            named = [
                line for line in entries.stdout.splitlines() if line.count(":") == 2 and line.split(":")[1]
            ]
            if not named:
                subprocess.run(["setfacl", "-x", "m::", folder], check=False, capture_output=True)
        for name in self._made:
            with contextlib.suppress(KeyError):
                pwd.getpwnam(name)
                subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
        self._made.clear()
        self._acl.clear()
