"""How a connection opens: TCP, the TLS handshake with the run's keys, the greeting.

A client's futures share a channel (:mod:`tlaunch.rpc.channel`) of two such
connections to each server, opened by :func:`open_channel`.

A client greets a server that may be on its host (:func:`may_share_memory`) with
its host's key (:func:`tlaunch.rpc.shm.host_key`); a server on the same host, as
the same user, offers a Unix socket for sealed memory files
(:mod:`tlaunch.rpc.fdpass`) in its answer. A server on another host is not
greeted: the round trip could only learn that it shares no memory.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

from tlaunch.errors import RPCError
from tlaunch.rpc import fdpass, shm, wire
from tlaunch.rpc.call_future import ChannelOwner
from tlaunch.rpc.framing import Connection, ProtocolError
from tlaunch.rpc.wire import HELLO

if TYPE_CHECKING:
    from tlaunch.rpc.channel import Channel

__all__ = ["answer_greeting", "connect", "may_share_memory", "open_channel", "wrap"]

_OPEN_TIMEOUT = 10.0  # seconds the server has to open a channel


def _open_tcp(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to ``host``: an IP address is connected to as it is, a name is resolved.

    A process's first ``getaddrinfo`` reads its name services' configuration and loads
    their modules (1-4 ms here), which a node's first call to its coordinator (at an IP
    address) would otherwise pay on its way to serving.
    """
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((host, port), timeout=timeout)


def connect(
    address: str, context: ssl.SSLContext, timeout: float, greet: bool = True, tls_server: bool = False
) -> Connection:
    """Open an authenticated connection to ``host:port``.

    ``greet``: say this host's key to a server that may be on this host (one round
    trip), so that it offers a Unix socket for large buffers as sealed memory files;
    without it they travel over TLS (a client whose messages are small saves the
    round trip, as does any client of a server on another host).
    ``tls_server``: this end takes the TLS server's part in the handshake (``context``
    is then a server's), as callers of a coordinator do (:class:`~tlaunch.rpc.server.RPCServer`).

    Raises:
        OSError: refused, unreachable, or the TLS handshake failed.
    """
    host, _, port = address.rpartition(":")
    raw = _open_tcp(host.strip("[]"), int(port), timeout)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = wrap(context, raw, server_side=tls_server)
    except BaseException:
        raw.close()
        raise
    sock.settimeout(None)
    conn = Connection(sock, address)
    key = shm.host_key() if greet and may_share_memory(sock) else None
    if key is not None:  # may large buffers go as sealed memory files? (one round trip)
        try:
            conn.send(HELLO, 0, [key])
            if not conn.readable(timeout):
                raise TimeoutError(f"{address} did not answer within {timeout} s")
            kind, _, answer = conn.recv()
            if kind != HELLO or len(answer) not in (1, 2):
                raise ProtocolError(f"{address} answered the greeting with message kind {kind}")
            if len(answer) == 2 and bytes(answer[0]) == key:  # it offers a Unix socket
                conn.fds = fdpass.join(bytes(answer[1]))
        except EOFError as exc:  # a server that is shutting down closes before it greets
            conn.close()
            raise ConnectionResetError(f"{address} closed the connection before its greeting") from exc
        except BaseException:
            conn.close()
            raise
    return conn


def wrap(context: ssl.SSLContext, raw: socket.socket, server_side: bool) -> ssl.SSLSocket:
    """``context.wrap_socket(raw)``, the TLS handshake done; what it made is closed if it fails.

    ``raw``'s descriptor passes to the new socket before the handshake. A peer that
    reset the connection before it left that socket open in Python's ``ssl`` before
    3.13 (CPython gh-113280; 3.13 closes it): ``raw`` closes nothing then, and the
    descriptor stayed open until the collector found the socket (a ResourceWarning).
    The socket is found in the failed call's frames and closed (closing twice is
    harmless).

    Raises:
        OSError: the handshake failed, or the connection was reset before it.
    """
    try:
        return context.wrap_socket(raw, server_side=server_side)
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None:
            made = tb.tb_frame.f_locals.get("self")
            if isinstance(made, ssl.SSLSocket):
                made.close()
            tb = tb.tb_next
        raise


def may_share_memory(sock: socket.socket) -> bool:
    """Whether the peer of connected ``sock`` may be a process of this host (of this network
    namespace): its address is a loopback one, or the one this end has. The kernel gives a
    connection to one of this host's own addresses that address as its source; to another
    host, an address of this one. (A server on this host reached through a translated
    address is taken for another host's: its large buffers go over TLS.)
    """
    try:
        here, there = (str(a[0]).removeprefix("::ffff:") for a in (sock.getsockname(), sock.getpeername()))
    except OSError:
        return False
    return here == there or there.startswith("127.") or there == "::1"


def answer_greeting(conn: Connection, req_id: int, buffers: list[memoryview], timeout: float) -> None:
    """A server's answer to a client's greeting (:func:`connect`'s); on this host as this
    user, with a Unix socket offered for sealed memory files, joined within ``timeout`` s."""
    key = shm.host_key()
    same = key is not None and len(buffers) == 1 and bytes(buffers[0]) == key
    rendezvous = fdpass.offer() if same and conn.fds is None else None
    try:
        conn.send(HELLO, req_id, [key or b"", rendezvous.name] if rendezvous else [key or b""])
    except BaseException:
        if rendezvous is not None:
            rendezvous.close()
        raise
    if rendezvous is not None:
        conn.fds = rendezvous.accept(conn.sock, conn.buffered(), timeout)


def open_channel(owner: ChannelOwner, address: str, connect: Callable[[], Connection]) -> Channel:
    """Open ``owner``'s futures channel to the server at ``address``: two connections
    (``connect()`` opens one), the replies' side first, tied by a random token.

    Raises:
        RPCError: the server did not open the channel in time.
        OSError: a connection failed, or the server closed it.
    """
    token = os.urandom(16)
    replies = connect()
    try:
        replies.send(wire.CHANNEL_REPLIES, 0, [token])
        if not replies.readable(_OPEN_TIMEOUT):
            raise RPCError(f"{address} did not open a futures channel within {_OPEN_TIMEOUT:.0f} s")
        kind, _, _ = replies.recv()
        if kind != wire.CHANNEL_READY:
            raise ProtocolError(f"{address} answered a channel with message kind {kind}")
        requests = connect()
    except EOFError as exc:
        replies.close()
        raise ConnectionResetError(f"{address} closed the channel") from exc
    except BaseException:
        replies.close()
        raise
    try:
        requests.send(wire.CHANNEL_REQUESTS, 0, [token])
    except BaseException:
        requests.close()
        replies.close()
        raise
    from tlaunch.rpc.channel import Channel  # loaded with the first channel (the client's futures)

    return Channel(owner, requests, replies)
