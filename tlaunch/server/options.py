"""``tlaunch server``'s options, and the checks of them that need nothing but the options.

The server runs every job as its own account unless ``--unix-users`` is given:
its ``--help`` and its start line say so (:data:`ONE_ACCOUNT`). A server reached
from other machines (a ``--host`` that is not a loopback address) needs tokens
and TLS, or ``--insecure`` to say that what it lacks is meant
(:func:`transport_problems`).
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import ssl
from collections.abc import Sequence

__all__ = [
    "ONE_ACCOUNT",
    "UNIX_ACCOUNTS",
    "parser",
    "is_loopback",
    "served_names",
    "transport_problems",
    "check_tls",
]

ONE_ACCOUNT = "one account: for a single trusted team"
"""What a server without ``--unix-users`` is (every job runs as the server's own account)."""
UNIX_ACCOUNTS = "unix accounts: each user's jobs run as their own account"
"""What a server with ``--unix-users`` is."""

_DESCRIPTION = f"""\
the tlaunch job server (REST API /v1, dashboard /dashboard/).

Users: without --unix-users every user's job runs as the server's own account ({ONE_ACCOUNT}):
a job can read what the server can, its token file and its database included, and other users'
jobs and files. With --unix-users (the server runs as root) each user's jobs run as their own
local account. docs/security.md says what each mode protects."""


def parser() -> argparse.ArgumentParser:
    """The options of ``tlaunch server``."""
    p = argparse.ArgumentParser(
        prog="tlaunch server", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="the port (default 8765; 0: any free one)")
    p.add_argument("--home", help="its TLAUNCH_HOME: run store, database, packages (default $TLAUNCH_HOME)")
    p.add_argument("--token-file", help="a line per user: TOKEN USER [admin] (its owner's alone: mode 600)")
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
    p.add_argument(
        "--unix-users",
        action="store_true",
        help="run each user's jobs as their own local account, the USER of their token file line (the "
        "server runs as root; on SSH hosts with the account's ~/.ssh, on SLURM as its sbatch)",
    )
    p.add_argument(
        "--max-streams-per-user",
        type=int,
        default=64,
        metavar="N",
        help="streams (logs -f, a dashboard tab's two) one user may hold open; past it, 429 (default 64)",
    )
    p.add_argument(
        "--max-starting",
        type=int,
        default=4,
        metavar="N",
        help="jobs launched at the same time; the others wait, PENDING (default 4)",
    )
    p.add_argument(
        "--env-keep-gb",
        type=float,
        default=50.0,
        metavar="GB",
        help="runtime environments kept (<home>/envs), the least recently used removed past it (default 50)",
    )
    p.add_argument(
        "--env-keep-days",
        type=float,
        default=30.0,
        metavar="DAYS",
        help="a runtime environment unused for longer is removed (default 30)",
    )
    p.add_argument(
        "--pool",
        metavar="POOL_YAML",
        help="a pool of SSH hosts the server schedules its jobs on (GPUs, CPUs, memory; a fair queue): "
        "docs/pool.md",
    )
    p.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM; with --tls-key)")
    p.add_argument("--tls-key", help="the certificate's private key (PEM)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve a non-loopback --host without TLS or without tokens (anyone on the way reads the "
        "tokens; without tokens anyone who reaches it runs commands as its account)",
    )
    return p


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one."""
    try:
        return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def served_names(host: str, names: Sequence[str]) -> tuple[str, ...]:
    """The ``Host`` names the server answers to (empty: any, a wildcard bind without ``--server-name``)."""
    wildcard = host in ("0.0.0.0", "::", "")
    if wildcard and not names:
        return ()
    local = () if wildcard else (host,)
    every = (*local, *names, "localhost", "127.0.0.1", "::1")
    return tuple(dict.fromkeys(n.lower().strip("[]") for n in every))


def transport_problems(host: str, tokens: bool, tls: bool) -> list[str]:
    """What a server on ``host`` lacks to be reached safely from other machines (empty: nothing)."""
    if is_loopback(host):
        return []
    problems = []
    if not tokens:
        problems.append("no token is set: anyone who reaches it runs commands as its account "
                        "(give --token-file or $TLAUNCH_SERVER_TOKEN)")  # fmt: skip
    if not tls:
        problems.append("it has no TLS: tokens and jobs cross the network in clear (give --tls-cert "
                        "and --tls-key)")  # fmt: skip
    return problems


def check_tls(cert: str | None, key: str | None) -> None:
    """Refuse a certificate without its key (or the reverse), or one that cannot be loaded.

    Raises:
        ValueError: what is wrong, naming the file.
    """
    if (cert is None) != (key is None):
        raise ValueError("give --tls-cert and --tls-key together (the certificate and its private key)")
    if cert is None or key is None:
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except ssl.SSLError as exc:  # an OSError too: asked first
        raise ValueError(
            f"--tls-cert {cert} / --tls-key {key} cannot be used: they must be a PEM certificate and its "
            f"private key ({exc})"
        ) from None
    except OSError as exc:
        raise ValueError(f"--tls-cert {cert} / --tls-key {key}: {exc.strerror or exc}") from None
