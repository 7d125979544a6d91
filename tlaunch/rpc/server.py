"""RPC server: serves an object's public methods over mutually authenticated TLS.

A peer without the run's key fails the TLS handshake and is dropped before
anything it sends is read. Connections come in two shapes:

* **Synchronous calls** use a connection per call in flight. One thread per
  connection reads a request, runs the method inline and writes the reply: no
  hand-off between threads, so a method that blocks holds only its own
  connection.
* **Futures** use a *channel*: many calls in flight on one connection of
  requests, their replies on a second connection (each TLS connection is then
  read by one thread and written by another, never both: OpenSSL forbids it).
  One reader runs the requests inline, one after another, and sends the replies
  of a burst together: under load, a wake-up and a write serve many calls (and
  a reader under sustained load polls up to 50 us before sleeping). A
  call that runs longer than :data:`STALL` s (a ``get`` that waits) is left to
  its thread by a monitor, which starts a new reader for the channel, so the
  calls behind it still run concurrently, as they would on connections of
  their own.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from tlaunch.rpc import wire
from tlaunch.rpc.admission import MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PEER, HandshakeGate, accept_forever
from tlaunch.rpc.dispatch import dispatch
from tlaunch.rpc.framing import Connection, ProtocolError
from tlaunch.rpc.opening import answer_greeting, wrap
from tlaunch.rpc.security import RunKeys

__all__ = ["MAX_HANDSHAKES", "MAX_HANDSHAKES_PER_PEER", "STALL", "RPCServer", "StopServing"]

log = logging.getLogger(__name__)
_HANDSHAKE_TIMEOUT = 10.0
STALL = 0.002  # s a channel's call may run before the calls behind it get a new reader
_QUIET = 0.05  # s without a call after which the stall monitor sleeps until the next one
# After sending a burst's replies, a reader whose last wait for a request was shorter than
# this polls for the next one this long before sleeping: a request written to a sleeping reader
# costs its sender a wake-up (~15 us on the test VM), which capped futures at ~39k calls/s;
# polling lifted it to ~54k. Only channels under sustained load poll, at most this per burst.
_SPIN = 50e-6
_BATCH = 16  # replies held back at most while more requests are waiting
_UNBOUND_TTL = 30.0  # s a replies side waits for its requests side

_Reply = tuple[int, int, Sequence[wire.Buffer]]


class _Channel:
    """Server side of a futures channel: requests read here, replies written there."""

    __slots__ = ("busy_since", "lock", "outbox", "reader", "replies", "requests", "send_lock")

    def __init__(self, requests: Connection, replies: Connection) -> None:
        self.requests = requests
        self.replies = replies
        self.lock = threading.Lock()  # reader, busy_since, outbox
        self.send_lock = threading.Lock()  # writes on ``replies``
        self.reader: object = object()  # the token of the thread reading requests now
        self.busy_since = 0.0  # when the reader's current call started; 0 between calls
        self.outbox: list[_Reply] = []

    def flush(self) -> None:
        with self.send_lock:
            with self.lock:
                batch, self.outbox = self.outbox, []
            if batch:
                self.replies.send_many(batch)


class StopServing(Protocol):
    """Stops a server (:meth:`RPCServer.close`); ``drain``: seconds running calls get to reply."""

    def __call__(self, drain: float = 0.0) -> None: ...


class RPCServer:
    """Serve ``target``'s public methods (names not starting with ``_``).

    Args:
        target: the object whose methods are called.
        keys: the run's keys; peers without them are refused at the handshake.
        bind_host: interface to bind.
        advertise_host: host part of :attr:`address` (defaults to ``bind_host``).
        port: the port to bind (0, the default: the OS picks a free one).
        tls_client: take the TLS client's part in handshakes (callers: RPCClient's ``tls_server``),
            as coordinators do: a node that serves then makes one TLS context (~1.3 ms), not two.
    """

    def __init__(
        self,
        target: object,
        keys: RunKeys,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        port: int = 0,
        tls_client: bool = False,
    ) -> None:
        self._target = target
        self._tls_client = tls_client
        self._context = keys.context(server=not tls_client)
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind_host, port))
        self._listener.listen(512)
        port = self._listener.getsockname()[1]
        host = advertise_host or bind_host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._gate = HandshakeGate()
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._ready = threading.Lock()  # held sending a replies side's READY (close() waits for it)
        self._closed = False
        self._calls: set[int] = set()  # threads running a call (until its reply is sent or queued)
        self._calls_done = threading.Condition(self._lock)
        self._unbound: dict[bytes, tuple[Connection, float]] = {}  # token -> replies side
        self._channels: set[_Channel] = set()
        self._monitor: threading.Thread | None = None
        self._busy = threading.Event()  # set while some channel may be running a call
        self._started = 0  # calls begun on channels (the stall monitor sleeps when it stops growing)
        self._thread = threading.Thread(
            target=accept_forever,
            args=(self._listener, self._gate, lambda: self._closed, self._serve_connection),
            name="tlaunch-rpc-accept",
            daemon=True,
        )
        self._thread.start()

    @property
    def rejected(self) -> int:
        """Connections refused before authentication (over the bounds, or a failed handshake)."""
        return self._gate.rejected

    def _serve_connection(self, raw: socket.socket, peer: str, host: str) -> None:
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.settimeout(_HANDSHAKE_TIMEOUT)
            sock = wrap(self._context, raw, server_side=not self._tls_client)
            sock.settimeout(None)
        except (ssl.SSLError, OSError) as exc:
            self._gate.failed()
            log.debug("refused a connection from %s: TLS handshake failed (%s)", peer, exc)
            raw.close()
            return
        finally:
            self._gate.done(host)
        conn = Connection(sock, peer)
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._conns.add(conn)
        keep = False  # the connection lives on as part of a channel
        try:
            while True:
                kind, req_id, buffers = conn.recv()
                if kind == wire.HELLO:
                    answer_greeting(conn, req_id, buffers, _HANDSHAKE_TIMEOUT)
                    continue
                if kind in (wire.CHANNEL_REPLIES, wire.CHANNEL_REQUESTS) and len(buffers) != 1:
                    raise ProtocolError(f"{peer} opened a channel without its token")
                if kind == wire.CHANNEL_REPLIES:
                    keep = self._register_replies(conn, bytes(buffers[0]))  # False: closed
                    return
                if kind == wire.CHANNEL_REQUESTS:
                    channel = self._bind(conn, bytes(buffers[0]))
                    keep = True  # the channel's current reader closes it when it ends
                    self._read_channel(channel, channel.reader)
                    return
                if kind != wire.REQUEST:
                    raise ProtocolError(f"{peer} sent message kind {kind}, expected a request")
                me = self._call_begins()
                try:
                    reply_kind, payload = dispatch(self._target, buffers)
                    del buffers
                    conn.send(reply_kind, req_id, payload)
                    del payload
                finally:
                    self._call_ends(me)
        except EOFError:
            pass
        except (OSError, ProtocolError, ValueError) as exc:  # ValueError: closed under us
            if not self._closed:
                log.debug("connection from %s ended: %s", peer, exc)
        finally:
            if not keep:
                self._drop(conn)

    def _drop(self, conn: Connection) -> None:
        with self._lock:
            self._conns.discard(conn)
        conn.close()

    # -- channels (futures) ------------------------------------------------
    def _register_replies(self, conn: Connection, token: bytes) -> bool:
        """Hold ``conn`` as channel ``token``'s replies side (never read again); False if closed."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return False
            stale = [t for t, (_, since) in self._unbound.items() if now - since > _UNBOUND_TTL]
            dropped = [self._unbound.pop(t)[0] for t in stale]
            self._unbound[token] = (conn, now)
        with self._ready:
            for c in dropped:
                self._drop(c)
            conn.send(wire.CHANNEL_READY, 0, [b""])
        return True

    def _bind(self, requests: Connection, token: bytes) -> _Channel:
        with self._lock:
            entry = self._unbound.pop(token, None)
            if entry is None:
                raise ProtocolError(f"{requests.peer} opened a channel with an unknown token")
            channel = _Channel(requests, entry[0])
            self._channels.add(channel)
            if self._monitor is None:
                self._monitor = threading.Thread(
                    target=self._watch_stalls, name="tlaunch-rpc-stalls", daemon=True
                )
                self._monitor.start()
        return channel

    def _read_channel(self, ch: _Channel, me: object) -> None:
        """Read ``ch``'s requests and run them while this thread (token ``me``) is its reader."""
        requests = ch.requests
        try:
            busy = False  # the last wait for a request was short: poll before sleeping
            while True:
                if ch.outbox and not requests.readable(0):
                    ch.flush()  # nothing more is waiting: send the burst's replies
                    if busy:
                        end = time.perf_counter() + _SPIN
                        while time.perf_counter() < end and not requests.readable(0):
                            pass
                waiting = time.perf_counter()
                kind, req_id, buffers = requests.recv()
                busy = time.perf_counter() - waiting < _SPIN
                if kind != wire.REQUEST:
                    raise ProtocolError(f"{requests.peer} sent message kind {kind}, expected a request")
                ch.busy_since = time.monotonic()
                self._started += 1
                if not self._busy.is_set():
                    self._busy.set()
                thread = self._call_begins()
                try:
                    reply_kind, payload = dispatch(self._target, buffers)
                    del buffers
                    with ch.lock:
                        mine = ch.reader is me
                        if mine:
                            ch.busy_since = 0.0
                        ch.outbox.append((reply_kind, req_id, payload))
                    del payload
                finally:
                    self._call_ends(thread)
                if not mine:  # the monitor gave the channel a new reader while this call ran
                    with contextlib.suppress(OSError, ValueError):  # the new one ends the channel
                        ch.flush()
                    return
                if len(ch.outbox) >= _BATCH:
                    ch.flush()
        except EOFError:
            pass
        except (OSError, ProtocolError, ValueError) as exc:  # ValueError: closed under us
            if not self._closed:
                log.debug("channel from %s ended: %s", requests.peer, exc)
        # Only the current reader ends the channel (a replaced one just returns above).
        with self._lock:
            self._channels.discard(ch)
        self._drop(requests)
        with ch.send_lock:  # a replaced reader may be sending its call's reply
            self._drop(ch.replies)

    def _watch_stalls(self) -> None:
        """Give a channel whose call runs past :data:`STALL` a new reader.

        It looks every :data:`STALL` s while calls come, and sleeps once none came
        for :data:`_QUIET` s: a reader that had to wake it at every burst (setting
        ``_busy``) would pay a wake-up and a hand-off of the GIL on its own path.
        """
        seen, quiet_since = -1, time.monotonic()
        while True:
            self._busy.wait()
            if self._closed:
                return
            time.sleep(STALL)
            now = time.monotonic()
            if self._started != seen:
                seen, quiet_since = self._started, now
            with self._lock:
                channels = list(self._channels)
            busy = False
            for ch in channels:
                since = ch.busy_since
                if not since:
                    continue
                busy = True
                if now - since < STALL:
                    continue
                with ch.lock:
                    if ch.busy_since != since:
                        continue
                    ch.reader = token = object()
                    ch.busy_since = 0.0
                threading.Thread(
                    target=self._read_channel, args=(ch, token), name="tlaunch-rpc-channel", daemon=True
                ).start()
            if not busy and now - quiet_since > _QUIET:
                self._busy.clear()
                if any(ch.busy_since for ch in channels):  # a call began while we looked
                    self._busy.set()

    def _call_begins(self) -> int:
        me = threading.get_ident()
        with self._lock:
            self._calls.add(me)
        return me

    def _call_ends(self, me: int) -> None:
        with self._lock:
            self._calls.discard(me)
            if self._closed:
                self._calls_done.notify_all()

    def close(self, drain: float = 0.0) -> None:
        """Stop serving and drop every connection; idempotent.

        Args:
            drain: seconds the calls already running may take to finish and send
                their replies before the connections drop (0: calls in flight get
                no reply). A call that closes its own server is not waited for.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._busy.set()  # the stall monitor sees _closed and ends
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        if drain > 0:
            self._drain(time.monotonic() + drain)
        # All end now; a thread reading one closes it (Connection.shutdown), replies' sides close here.
        with self._lock:
            conns, channels = list(self._conns), list(self._channels)
            unbound = [conn for conn, _ in self._unbound.values()]
        for conn in conns:  # replies' sides too (every connection is in _conns until dropped):
            conn.shutdown()  # a write blocked on one fails, and frees its lock for the close below
        with self._ready:
            for conn in unbound:
                conn.close()
        for ch in channels:
            with ch.send_lock:
                ch.replies.close()
        self._thread.join(5)

    def _drain(self, deadline: float) -> None:
        """Wait (until ``deadline``) for the running calls, then send the channels' queued replies."""
        me = threading.get_ident()
        with self._lock:
            while self._calls - {me} and (left := deadline - time.monotonic()) > 0:
                self._calls_done.wait(left)
            channels = list(self._channels)
        for ch in channels:
            with contextlib.suppress(OSError, ValueError):
                ch.flush()

    def __enter__(self) -> RPCServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
