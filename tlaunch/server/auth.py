"""Who is asking: bearer tokens, one per user, compared in constant time.

Tokens come from a file (``--token-file``: a line per user, ``TOKEN USER
[admin]``, ``#`` comments) or a single admin token in
``$TLAUNCH_SERVER_TOKEN``. A user sees, follows, stops and deletes only their
own jobs; an admin sees every job.
"""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["User", "Users", "load_users"]

_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class User:
    """A user of the server."""

    name: str
    admin: bool = False

    def may_see(self, owner: str) -> bool:
        """Whether this user may read and control a job of ``owner``."""
        return self.admin or owner == self.name


class Users:
    """The tokens the server accepts."""

    def __init__(self, tokens: Mapping[str, User]) -> None:
        self._tokens = dict(tokens)

    def __bool__(self) -> bool:
        return bool(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def names(self) -> list[str]:
        """The users' names, sorted."""
        return sorted({user.name for user in self._tokens.values()})

    def check(self, token: str) -> User | None:
        """The user of ``token``, comparing against every token in constant time."""
        found = None
        given = token.encode()
        for known, user in self._tokens.items():
            if hmac.compare_digest(known.encode(), given):
                found = user
        return found


def load_users(token_file: str | None, environ: Mapping[str, str] | None = None) -> Users:
    """The users of ``token_file`` and ``$TLAUNCH_SERVER_TOKEN`` (an admin named ``admin``).

    Raises:
        ValueError: a line of the file is not ``TOKEN USER [admin]``, a token is too short,
            or the file is readable by other users than its owner.
    """
    env = os.environ if environ is None else environ
    tokens: dict[str, User] = {}
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode & 0o777
            if mode & 0o077:
                raise ValueError(
                    f"{token_file} is readable by others than its owner (mode {mode:04o}): anyone who "
                    f"reads it is any user of the server, the admins too; chmod 600 {token_file}"
                )
            for number, line in enumerate(f, 1):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                if len(words) not in (2, 3) or (len(words) == 3 and words[2] != "admin"):
                    raise ValueError(f"{token_file} line {number}: write 'TOKEN USER' or 'TOKEN USER admin'")
                if not _USER.match(words[1]):
                    raise ValueError(
                        f"{token_file} line {number}: user {words[1]!r} is not a name; use letters, "
                        "digits, '_', '-' and '.', as an account name (it names the user's folders)"
                    )
                tokens[words[0]] = User(words[1], admin=len(words) == 3)
    if env.get("TLAUNCH_SERVER_TOKEN"):
        tokens[env["TLAUNCH_SERVER_TOKEN"]] = User("admin", admin=True)
    short = [u.name for t, u in tokens.items() if len(t) < 16]
    if short:
        raise ValueError(
            f"the tokens of {short} are shorter than 16 characters; use e.g. `openssl rand -hex 16`"
        )
    return Users(tokens)
