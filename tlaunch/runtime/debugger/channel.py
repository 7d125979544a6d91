"""The debugger's channel: a TLS listener of the paused node that only the run's key opens.

A paused node listens on a port of its own (any free one, on the address its RPC
servers use) and completes a handshake only with a peer that presents the run's
certificate (mutual TLS 1.3 with the run's keys, as every RPC connection of the
run: :mod:`tlaunch.rpc.security`). A peer without it fails the handshake before a
byte of a command is read; the node logs it and waits on. One debugger at a time:
the listener closes once one is in. The session's connection has TCP keepalives,
so a debugger whose machine vanished (no FIN ever comes) is noticed within
:data:`LOST_AFTER` seconds and the node goes on.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time

from tlaunch.rpc.security import RunKeys

__all__ = ["HANDSHAKE", "LOST_AFTER", "Listener", "connect", "split_address"]

log = logging.getLogger(__name__)

HANDSHAKE = 5.0
"""Seconds a connecting peer gets to complete the TLS handshake."""
LOST_AFTER = 25.0
"""Seconds of a silent, dead peer (keepalives unanswered) before a session counts as lost."""
_IDLE, _INTERVAL, _PROBES = 10, 5, 3  # 10 + 3 x 5 = LOST_AFTER


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port).

    Raises:
        ValueError: it is not one.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not a HOST:PORT address")
    return host.strip("[]"), int(port)


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", _IDLE), ("TCP_KEEPINTVL", _INTERVAL), ("TCP_KEEPCNT", _PROBES)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class Listener:
    """Where a paused node waits for its debugger (see the module docstring).

    Args:
        keys: the run's keys.
        bind_host: the address to listen on (the node's RPC servers').
        advertise_host: the address debuggers reach it at.
    """

    def __init__(self, keys: RunKeys, bind_host: str, advertise_host: str) -> None:
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._keys = keys
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.bind((bind_host, 0))
            self._sock.listen(4)
        except OSError:
            self._sock.close()
            raise
        self._sock.settimeout(0.25)
        port = self._sock.getsockname()[1]
        self.address = f"[{advertise_host}]:{port}" if ":" in advertise_host else f"{advertise_host}:{port}"
        self.refused = 0

    def accept(self, until: threading.Event, deadline: float | None) -> ssl.SSLSocket | None:
        """The first peer that holds the run's key; None once ``until`` is set or ``deadline``
        (``time.monotonic()``) passes."""
        context = self._keys.context(server=True)
        while not until.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                raw, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return None
            raw.settimeout(HANDSHAKE)
            try:
                tls = context.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                raw.close()
                self.refused += 1
                log.warning("refused a debugger from %s: it does not hold the run's key (%s)", peer[0], exc)
                continue
            tls.settimeout(None)
            _keepalive(tls)
            return tls
        return None

    def close(self) -> None:
        """Stop listening; idempotent."""
        with contextlib.suppress(OSError):
            self._sock.close()


def connect(address: str, keys: RunKeys, timeout: float = 10.0) -> ssl.SSLSocket:
    """A debugger's connection to the paused node at ``address``, sealed with the run's ``keys``.

    In TLS 1.3 the node checks the debugger's certificate after the debugger's side of
    the handshake is done: a node that refuses it shows as the connection's end on
    the first read, not here.

    Raises:
        OSError: the node cannot be reached (it went on, or its host is gone).
        ssl.SSLError: the node is not of this run (its certificate is not the run's).
    """
    host, port = split_address(address)
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        tls = keys.context(server=False).wrap_socket(raw)
    except BaseException:
        raw.close()
        raise
    tls.settimeout(None)
    _keepalive(tls)
    return tls
