"""Accepting connections, and bounds on those that are not authenticated yet.

No error a peer can provoke ends the accept loop. Connections in their TLS
handshake are counted, in all and per source address; beyond
:data:`MAX_HANDSHAKES` and :data:`MAX_HANDSHAKES_PER_PEER`, a new connection is
closed at once, so a flood of keyless connections cannot exhaust descriptors or
threads, nor keep others out for long.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["MAX_HANDSHAKES", "MAX_HANDSHAKES_PER_PEER", "HandshakeGate", "accept_forever"]

log = logging.getLogger(__name__)

MAX_HANDSHAKES = 128
MAX_HANDSHAKES_PER_PEER = 32
_TRANSIENT = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN, errno.EPERM}
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class HandshakeGate:
    """Admits connections to their handshake within the bounds; counts those refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0
        self._peers: dict[str, int] = {}  # source address -> its connections in their handshake
        self.rejected = 0  # connections refused here or failing their handshake

    def admit(self, host: str) -> bool:
        """Whether a new connection from ``host`` may start its handshake (then call :meth:`done`)."""
        with self._lock:
            if self._total >= MAX_HANDSHAKES or self._peers.get(host, 0) >= MAX_HANDSHAKES_PER_PEER:
                self.rejected += 1
                return False
            self._total += 1
            self._peers[host] = self._peers.get(host, 0) + 1
            return True

    def done(self, host: str) -> None:
        """A handshake of ``host`` admitted by :meth:`admit` ended (either way)."""
        with self._lock:
            self._total -= 1
            left = self._peers.get(host, 1) - 1
            if left > 0:
                self._peers[host] = left
            else:
                self._peers.pop(host, None)

    def failed(self) -> None:
        """Count a connection whose handshake failed."""
        with self._lock:
            self.rejected += 1


def accept_forever(
    listener: socket.socket,
    gate: HandshakeGate,
    closed: Callable[[], bool],
    serve: Callable[[socket.socket, str, str], None],
) -> None:
    """Accept on ``listener`` until ``closed()``; ``serve(sock, "host:port", host)`` each in a thread.

    Out of descriptors or memory (a flood of connections), it backs off and
    retries; a connection ``gate`` does not admit is closed at once. ``serve``
    must call ``gate.done(host)`` when the connection's handshake ends.
    """
    backoff = 0.0
    while not closed():
        try:
            raw, peer = listener.accept()
        except OSError as exc:
            if closed():
                return
            if exc.errno in _TRANSIENT:
                continue
            backoff = min(1.0, max(0.01, backoff * 2))
            if backoff == 1.0 or exc.errno not in _EXHAUSTED:
                log.warning("accepting a connection failed (%s); retrying in %.2f s", exc, backoff)
            time.sleep(backoff)
            continue
        backoff = 0.0
        if closed():
            raw.close()
            return
        host = str(peer[0])
        if not gate.admit(host):
            raw.close()
            continue
        name = f"{host}:{peer[1]}"
        try:
            threading.Thread(
                target=serve, args=(raw, name, host), name=f"tlaunch-rpc-{name}", daemon=True
            ).start()
        except RuntimeError as exc:  # no thread can be started now
            gate.done(host)
            raw.close()
            log.warning("dropped a connection from %s: %s", name, exc)
            time.sleep(0.05)
