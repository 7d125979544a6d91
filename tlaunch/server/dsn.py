"""Where the server's database is, said without putting its password where others read it.

A command line is readable by every local user (``ps``, ``/proc/<pid>/cmdline``),
so a ``--db`` URL with a password is refused; the URL comes instead from
``$TLAUNCH_SERVER_DB`` or a file (``--db-file``, one line), and every message
that names the database shows it with its password hidden (:func:`hide_password`).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

__all__ = ["DB_VARIABLE", "database_url", "hide_password"]

DB_VARIABLE = "TLAUNCH_SERVER_DB"
"""The environment variable that may hold the database's URL."""


def hide_password(url: str) -> str:
    """``url`` with its password (if any) as ``***``: ``postgresql://u:***@host/db``."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


def database_url(given: str | None, file: str | None, environ: Mapping[str, str]) -> str | None:
    """The database's URL: ``--db`` (without a password), else ``--db-file``'s, else ``$TLAUNCH_SERVER_DB``.

    Raises:
        ValueError: ``--db`` holds a password, both ``--db`` and ``--db-file`` are given,
            or the file cannot be read or is empty (the message says how to fix it).
    """
    if given and file:
        raise ValueError("give --db or --db-file, not both")
    if given:
        try:
            password = urlsplit(given).password
        except ValueError:
            password = None
        if password:
            raise ValueError(
                f"--db {hide_password(given)} holds a password, which every local user can read on the "
                f"server's command line; put the URL in ${DB_VARIABLE} or in a 0600 file (--db-file FILE)"
            )
        return given
    if file:
        try:
            with open(file, encoding="utf-8") as f:
                url = f.read().strip()
        except OSError as exc:
            raise ValueError(f"--db-file {file}: {exc.strerror or exc}") from None
        if not url:
            raise ValueError(f"--db-file {file} is empty; write the database's URL in it (one line)")
        return url
    return environ.get(DB_VARIABLE) or None
