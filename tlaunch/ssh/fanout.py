"""Many hosts at once: connect to them all, run a function on each; every host's outcome comes back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

from tlaunch.errors import HostsError, LaunchError
from tlaunch.ssh.config import ConfigFile
from tlaunch.ssh.connection import Connection
from tlaunch.ssh.known_hosts import KnownHosts

__all__ = ["connect_all", "pmap", "raise_for_hosts"]

T = TypeVar("T")


def pmap(
    fn: Callable[[str], T], items: list[str], conns: Mapping[str, Connection] | None = None
) -> dict[str, T | BaseException]:
    """``fn`` on every item (host) in parallel; exceptions are returned, not raised.

    If the caller is interrupted (Ctrl-C), the commands running on ``conns`` are
    cut short and every worker has returned before the interrupt propagates, so
    that cleanup does not race a worker still shipping.
    """
    pool = ThreadPoolExecutor(max(1, min(32, len(items))))
    try:
        futures = {item: pool.submit(fn, item) for item in items}
        wait(list(futures.values()))
    except BaseException:
        for conn in (conns or {}).values():
            conn.interrupted.set()
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        finally:  # a second Ctrl-C in the wait too: the cleanup's commands must still run
            for conn in (conns or {}).values():
                conn.interrupted.clear()
        raise
    pool.shutdown()
    out: dict[str, Any] = {}
    for item, f in futures.items():
        exc = f.exception()
        out[item] = exc if exc is not None else f.result()
    return out


def raise_for_hosts(results: Mapping[str, Any], what: str | None = None) -> None:
    """Raise one error for every host whose result is an exception (an interrupt first).

    Raises:
        KeyboardInterrupt: a host's work was interrupted.
        HostsError: with ``what`` None, naming every failing host.
        LaunchError: ``what`` failed, with every host's error in its message.
    """
    errors = {h: r for h, r in results.items() if isinstance(r, BaseException)}
    for r in errors.values():
        if isinstance(r, KeyboardInterrupt):
            raise r
    if not errors:
        return
    if what is None:
        raise HostsError(errors)
    raise LaunchError(f"{what} failed: {HostsError(errors)}")


def connect_all(
    hosts: list[str],
    ssh_config: str | None = None,
    accept_unknown_hosts: bool = False,
    timeout: float = 10.0,
    then: Callable[[Connection], object] | None = None,
    release: Callable[[], object] | None = None,
) -> dict[str, Connection]:
    """Connect to every host in parallel.

    ``then``: run on each connection as soon as it is open, in the same worker (a host's
    checks start while slower hosts still shake hands); its failure is its host's.
    ``release``: run when the connections are about to close because the whole failed
    (what ``then`` left on the hosts goes while they are still open).

    Raises:
        HostsError: one or more hosts failed; it lists every failing host, and
            the connections that did open are closed.
        KeyboardInterrupt: the commands ``then`` runs are cut short, every worker has
            returned and every connection is closed before it propagates.
    """
    unique = list(dict.fromkeys(hosts))
    config, known = ConfigFile(ssh_config), KnownHosts()  # each file read once for all hosts
    opened: dict[str, Connection] = {}
    stopping = threading.Event()

    def close_all() -> None:
        """The whole failed: ``release`` first, while the connections are open; then close them."""
        try:
            if release is not None:
                release()
        finally:
            for conn in list(opened.values()):
                conn.close()

    def one(host: str) -> Connection:
        conn = opened[host] = Connection(config.target(host), accept_unknown_hosts, timeout, known)
        if stopping.is_set():  # opened after the interrupt went round: its commands end at once
            conn.interrupted.set()
        if then is not None:
            then(conn)
        return conn

    pool = ThreadPoolExecutor(max(1, min(64, len(unique))))
    try:
        futures = {h: pool.submit(one, h) for h in unique}
        wait(list(futures.values()))
    except BaseException:
        stopping.set()
        for conn in list(opened.values()):
            conn.interrupted.set()
        pool.shutdown(wait=True, cancel_futures=True)
        close_all()
        raise
    pool.shutdown()
    errors = {h: exc for h, f in futures.items() if (exc := f.exception()) is not None}
    if errors:
        close_all()
        raise HostsError(errors)
    return {h: f.result() for h, f in futures.items()}
