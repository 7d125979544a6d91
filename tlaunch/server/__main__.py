"""``python -m tlaunch.server`` (``tlaunch server``): check the options, listen, say so in one line, serve."""

from __future__ import annotations

import ctypes
import logging
import os
import pwd
import socket
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from tlaunch.server.dsn import DB_VARIABLE, database_url, hide_password
from tlaunch.server.options import (
    ONE_ACCOUNT,
    UNIX_ACCOUNTS,
    check_tls,
    parser,
    served_names,
    transport_problems,
)

__all__ = ["main"]

_INSTALL = "the job server needs its extra: pip install 'tlaunch[server]'"
_KEEP_ALIVE = 75  # seconds an idle connection is kept open


def _private_process() -> None:
    """Make this process's memory, environment and descriptors unreadable to other processes of its
    account (``/proc/<pid>/environ``, ``mem``, ``fd``; no ptrace): what it read stays its own."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0 (reset at exec: its jobs are not affected)
    except (OSError, AttributeError):  # not Linux: nothing to do
        pass


def _password(url: str | None) -> str | None:
    try:
        return urlsplit(url).password if url else None
    except ValueError:
        return None


def _me() -> str:
    """This process's account, by name (its uid if it has none)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def _say(text: str) -> None:
    print(f"tlaunch server: {text}", file=sys.stderr, flush=True)


def _logging() -> None:
    """The server's warnings, and its access log (one line a request), on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    access = logging.getLogger("tlaunch.server.access")
    access.setLevel(logging.INFO)
    access.addHandler(handler)
    access.propagate = False
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (``port`` 0: a free one), whose connections send at once.

    asyncio sets ``TCP_NODELAY`` only on connections of a socket made with ``IPPROTO_TCP``;
    ``create_server``'s has protocol 0, so the listener sets it (its connections inherit it).
    Without it, every answer after a connection's first waited 40 ms: its body held back (Nagle)
    until the client acknowledged its headers, which the client delays (delayed ACK).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _more_descriptors() -> None:
    """As many open files as the system lets this process have: each open stream is a connection."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or not allowed: the limit stays
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options, check them, serve until interrupted."""
    args = parser().parse_args(argv)
    for flag, value in (
        ("--max-streams-per-user", args.max_streams_per_user),
        ("--max-starting", args.max_starting),
    ):
        if value < 1:
            _say(f"{flag} {value}: give 1 or more")
            return 2
    _private_process()
    try:
        import uvicorn

        from tlaunch.errors import LaunchError
        from tlaunch.server.app import Settings, create_app
        from tlaunch.server.auth import load_users
        from tlaunch.server.unixusers import UnixUsers, check_token_file
    except ImportError:
        _say(_INSTALL)
        return 2
    home = args.home or os.environ.get("TLAUNCH_HOME") or os.path.join(os.path.expanduser("~"), ".tlaunch")
    try:
        users = load_users(args.token_file)
        db = database_url(args.db, args.db_file, os.environ)
        check_tls(args.tls_cert, args.tls_key)
        if args.pool:
            from tlaunch.pool import load_pool

            load_pool(args.pool)  # every mistake of the file, before anything starts
    except (OSError, ValueError) as exc:
        _say(str(exc))
        return 2
    tls = args.tls_cert is not None
    problems = transport_problems(args.host, bool(users), tls)
    if problems and not args.insecure:
        _say(f"--host {args.host} is not a loopback address, and {'; and '.join(problems)}; or give "
             "--insecure if that is meant")  # fmt: skip
        return 2
    for secret in ("TLAUNCH_SERVER_TOKEN", DB_VARIABLE):  # read: nothing started from here gets them
        os.environ.pop(secret, None)
    os.environ["TLAUNCH_HOME"] = home  # the jobs' runs are recorded in the server's store
    unix = None
    if args.unix_users:
        try:
            unix = UnixUsers(home, users.names())  # root, first
            if not users:
                raise ValueError("--unix-users needs --token-file: its USERs are the accounts jobs run as")
            check_token_file(args.token_file)
            os.makedirs(home, mode=0o700, exist_ok=True)
            unix.prepare()
            unix.check()
        except (LaunchError, ValueError, OSError) as exc:
            _say(str(exc))
            return 2
    os.makedirs(home, mode=0o700, exist_ok=True)
    settings = Settings(
        home=home,
        users=users,
        max_package_bytes=args.max_package_mb << 20,
        db=db,
        job_env=tuple(args.job_env),
        max_request_bytes=args.max_request_kb << 10,
        server_names=served_names(args.host, args.server_name),
        unix=unix,
        max_streams_per_user=args.max_streams_per_user,
        max_starting=args.max_starting,
        env_keep_bytes=int(args.env_keep_gb * (1 << 30)),
        env_keep_days=args.env_keep_days,
        pool=os.path.abspath(args.pool) if args.pool else None,
    )
    try:
        app = create_app(settings)
    except Exception as exc:  # the database cannot be reached or read: say so, no traceback
        said = str(exc)
        password = _password(db)
        if password:
            said = said.replace(password, "***")
        _say(f"{hide_password(db) if db else 'the database'}: {said}")
        return 2
    try:
        sock = _listen(args.host, args.port)
    except OSError as exc:
        _say(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 2
    _logging()
    scheme = "https" if tls else "http"
    port = sock.getsockname()[1]
    where = f"[{args.host}]" if ":" in args.host else args.host
    shown = socket.getfqdn() if args.host in ("0.0.0.0", "::") else where  # a name to open
    database = hide_password(db) if db else os.path.join(home, "server", "jobs.db")
    _say(
        f"listening on {scheme}://{where}:{port}, dashboard {scheme}://{shown}:{port}/dashboard/; "
        f"home {home}; database {database}; users: "
        + (
            f"{UNIX_ACCOUNTS} ({', '.join(unix.accounts)})"
            if unix
            else f"{ONE_ACCOUNT} ({len(users)} tokens; every job runs as {_me()} and can read the token "
            "file and the database)"
        )
        + (f"; INSECURE: {'; '.join(problems)}" if problems else "")
    )
    _more_descriptors()
    # Keep-alive longer than a client keeps an idle connection (httpx: 5 s), so a client never
    # sends a request on a connection the server is closing at that moment.
    config = uvicorn.Config(
        app,
        log_level="warning",
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
        access_log=False,
        timeout_keep_alive=_KEEP_ALIVE,
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
