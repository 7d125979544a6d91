"""Who is asking: bearer tokens, one per user, compared in constant time; read again when they change.

Tokens come from a file (``--token-file``: a line per user, ``TOKEN USER
[admin]``, ``#`` comments) or a single admin token in
``$TLAUNCH_SERVER_TOKEN``. A user sees, follows, stops and deletes only their
own jobs; an admin sees every job.

The file is read again when it changes (the server looks twice a second, and
at once on ``SIGHUP``): a user added can call at once, a token removed is
refused at once, on the streams it holds open too (they end). A file that no
longer parses leaves the tokens as they were, and says why in the log. Each
change is logged with the users added, removed or changed, never a token.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["User", "Users", "load_users", "read_tokens"]

log = logging.getLogger(__name__)

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
    """The tokens the server accepts, and where they come from (to read them again).

    Args:
        tokens: token -> user.
        token_file: the file they were read from (None: fixed, e.g. a single admin token).
        environ: where ``$TLAUNCH_SERVER_TOKEN`` is read again (default ``os.environ``).
    """

    def __init__(
        self,
        tokens: Mapping[str, User],
        token_file: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._tokens = dict(tokens)
        self.token_file = token_file
        self._environ = environ
        self._stamp = _stamp(token_file)
        self.required = bool(self._tokens) or token_file is not None
        """Whether a request needs a token: fixed at start (a file emptied later refuses everyone)."""
        self.generation = 0
        """Counts the changes: whoever holds a user from an earlier one checks its token again."""

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
        for known, user in self._tokens.items():  # a reference to one dict: a reload swaps it whole
            if hmac.compare_digest(known.encode(), given):
                found = user
        return found

    def reload(self, *, force: bool = False) -> bool:
        """Read the token file again if it changed (``force``: whether or not); whether the tokens changed.

        A file that cannot be read or parsed leaves the tokens as they are (logged).
        """
        if self.token_file is None:
            return False
        stamp = _stamp(self.token_file)
        if stamp == self._stamp and not force:
            return False
        try:
            tokens = read_tokens(self.token_file, self._environ)
        except (OSError, ValueError) as exc:
            if stamp != self._stamp:
                log.error("tokens: %s; keeping the %d tokens read before", exc, len(self._tokens))
            self._stamp = stamp
            return False
        self._stamp = stamp
        if tokens == self._tokens:
            return False
        before = {u.name: u for u in self._tokens.values()}
        after = {u.name: u for u in tokens.values()}
        added = sorted(set(after) - set(before))
        removed = sorted(set(before) - set(after))
        role = sorted(n for n in set(before) & set(after) if before[n] != after[n])
        same_names = sorted(n for n in set(before) & set(after) if n not in role)
        renewed = [n for n in same_names if _tokens_of(self._tokens, n) != _tokens_of(tokens, n)]
        self._tokens = tokens
        self.generation += 1
        log.warning(
            "tokens of %s read again: %d users; added %s, removed %s, role changed %s, token changed %s",
            self.token_file,
            len(after),
            added or "none",
            removed or "none",
            role or "none",
            renewed or "none",
        )
        return True


def _tokens_of(tokens: Mapping[str, User], name: str) -> set[str]:
    return {t for t, u in tokens.items() if u.name == name}


def _stamp(path: str | None) -> tuple[int, int, int, int] | None:
    """What changes when a file is written or replaced (inode, size, mtime, ctime)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_tokens(token_file: str | None, environ: Mapping[str, str] | None = None) -> dict[str, User]:
    """The tokens of ``token_file`` and ``$TLAUNCH_SERVER_TOKEN`` (an admin named ``admin``).

    Raises:
        ValueError: a line of the file is not ``TOKEN USER [admin]``, a token is too short,
            or the file is readable by other users than its owner.
        OSError: the file cannot be read.
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
    return tokens


def load_users(token_file: str | None, environ: Mapping[str, str] | None = None) -> Users:
    """The users of ``token_file`` and ``$TLAUNCH_SERVER_TOKEN``, to read again (:meth:`Users.reload`).

    ``$TLAUNCH_SERVER_TOKEN`` is read now, once: a server takes it out of its environment after.

    Raises:
        ValueError: a line of the file is not ``TOKEN USER [admin]``, a token is too short,
            or the file is readable by other users than its owner.
        OSError: the file cannot be read.
    """
    env = os.environ if environ is None else environ
    kept = {"TLAUNCH_SERVER_TOKEN": env["TLAUNCH_SERVER_TOKEN"]} if env.get("TLAUNCH_SERVER_TOKEN") else {}
    return Users(read_tokens(token_file, kept), token_file, kept)
