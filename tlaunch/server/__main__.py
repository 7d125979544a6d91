"""``python -m tlaunch.server``: serve the job server's API."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from collections.abc import Sequence

__all__ = ["main"]

_INSTALL = "the job server needs its extra: pip install 'tlaunch[server]'"


def _loopback(host: str) -> bool:
    try:
        return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the options, check them, serve until interrupted."""
    p = argparse.ArgumentParser(prog="tlaunch server", description="the tlaunch job server (REST API, /v1)")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--home", help="its TLAUNCH_HOME: run store, database, packages (default $TLAUNCH_HOME)")
    p.add_argument("--token-file", help="a line per user: TOKEN USER [admin]")
    p.add_argument("--db", help="postgresql://user@host/db (default: SQLite in <home>/server/jobs.db)")
    p.add_argument("--max-package-mb", type=int, default=512)
    args = p.parse_args(argv)
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
    os.environ["TLAUNCH_HOME"] = home  # the jobs' runs are recorded in the server's store
    os.makedirs(home, mode=0o700, exist_ok=True)
    settings = Settings(home=home, users=users, max_package_bytes=args.max_package_mb << 20, db=args.db)
    try:
        app = create_app(settings)
    except Exception as exc:  # the database cannot be reached or read: say so, no traceback
        print(f"tlaunch server: {args.db or 'the database'}: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
