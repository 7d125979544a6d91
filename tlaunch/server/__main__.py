"""``python -m tlaunch.server``: serve the job server's API."""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import os
import socket
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from tlaunch.server.dsn import DB_VARIABLE, database_url, hide_password

__all__ = ["main"]

_INSTALL = "the job server needs its extra: pip install 'tlaunch[server]'"


def _loopback(host: str) -> bool:
    try:
        return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def _private_process() -> None:
    """Make this process's memory, environment and descriptors unreadable to other processes of its
    account (``/proc/<pid>/environ``, ``mem``, ``fd``; no ptrace): what it read stays its own."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0 (reset at exec: its jobs are not affected)
    except (OSError, AttributeError):  # not Linux: nothing to do
        pass


def _served_names(host: str, names: Sequence[str]) -> tuple[str, ...]:
    """The ``Host`` names the server answers to (empty: any, a wildcard bind without ``--server-name``)."""
    wildcard = host in ("0.0.0.0", "::", "")
    if wildcard and not names:
        return ()
    local = () if wildcard else (host,)
    every = (*local, *names, "localhost", "127.0.0.1", "::1")
    return tuple(dict.fromkeys(n.lower().strip("[]") for n in every))


def _password(url: str | None) -> str | None:
    try:
        return urlsplit(url).password if url else None
    except ValueError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options, check them, serve until interrupted."""
    p = argparse.ArgumentParser(prog="tlaunch server", description="the tlaunch job server (REST API, /v1)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--home", help="its TLAUNCH_HOME: run store, database, packages (default $TLAUNCH_HOME)")
    p.add_argument("--token-file", help="a line per user: TOKEN USER [admin]")
    p.add_argument(
        "--db",
        help="postgresql://user@host/db, no password (default: $TLAUNCH_SERVER_DB, else SQLite in "
        "<home>/server/jobs.db)",
    )
    p.add_argument("--db-file", help="a file holding the database's URL (one that has a password)")
    p.add_argument("--max-package-mb", type=int, default=512, help="the largest package upload (413 above)")
    p.add_argument(
        "--max-request-kb", type=int, default=1024, help="the largest JSON request body (413 above; 1024)"
    )
    p.add_argument(
        "--server-name",
        action="append",
        default=[],
        metavar="NAME",
        help="a name clients reach the server by (a Host header it accepts besides its address and "
        "localhost); repeatable",
    )
    p.add_argument(
        "--job-env",
        action="append",
        default=[],
        metavar="NAME",
        help="a variable of the server's environment its jobs get too (a pattern: NCCL_*); repeatable. "
        "Jobs get only PATH, LANG, LC_*, TZ, TMPDIR, PYTHONPATH, VIRTUAL_ENV, SLURM_CONF of it otherwise",
    )
    args = p.parse_args(argv)
    _private_process()
    try:
        import uvicorn

        from tlaunch.server.app import Settings, create_app
        from tlaunch.server.auth import load_users
    except ImportError:
        print(f"tlaunch server: {_INSTALL}", file=sys.stderr)
        return 2
    home = args.home or os.environ.get("TLAUNCH_HOME") or os.path.join(os.path.expanduser("~"), ".tlaunch")
    try:
        users = load_users(args.token_file)
        db = database_url(args.db, args.db_file, os.environ)
    except (OSError, ValueError) as exc:
        print(f"tlaunch server: {exc}", file=sys.stderr)
        return 2
    if not users and not _loopback(args.host):
        print(
            f"tlaunch server: --host {args.host} is not a loopback address, and no token is set: anyone who "
            "reaches it could run commands as you; give --token-file or $TLAUNCH_SERVER_TOKEN",
            file=sys.stderr,
        )
        return 2
    for secret in ("TLAUNCH_SERVER_TOKEN", DB_VARIABLE):  # read: nothing started from here gets them
        os.environ.pop(secret, None)
    os.environ["TLAUNCH_HOME"] = home  # the jobs' runs are recorded in the server's store
    os.makedirs(home, mode=0o700, exist_ok=True)
    settings = Settings(
        home=home,
        users=users,
        max_package_bytes=args.max_package_mb << 20,
        db=db,
        job_env=tuple(args.job_env),
        max_request_bytes=args.max_request_kb << 10,
        server_names=_served_names(args.host, args.server_name),
    )
    try:
        app = create_app(settings)
    except Exception as exc:  # the database cannot be reached or read: say so, no traceback
        said = str(exc)
        password = _password(db)
        if password:
            said = said.replace(password, "***")
        print(f"tlaunch server: {hide_password(db) if db else 'the database'}: {said}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
