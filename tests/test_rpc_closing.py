"""A connection that a thread is reading or writing is closed by that thread, never under it.

OpenSSL reads and writes a socket by its descriptor's number. A socket closed by
one thread while another was inside OpenSSL on it freed that number for the
next socket the process opened; the reading thread then sent its fatal alert on
the end (24 bytes) into the new connection, whose handshake failed
(``tests/test_rpc_shm.py``, ~4 % of runs). Another thread may only end such a
connection (``Connection.shutdown``): the thread using it closes it as it stops.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tlaunch.errors import RPCError
from tlaunch.rpc import RPCClient, RPCServer, RunKeys, wire
from tlaunch.rpc import server as server_module
from tlaunch.rpc.client import fixed_resolver
from tlaunch.rpc.framing import Connection
from tlaunch.rpc.opening import connect


class Slow:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.ended = threading.Event()

    def ping(self) -> str:
        return "pong"

    def slow(self, seconds: float) -> str:
        self.started.set()
        time.sleep(seconds)
        self.ended.set()
        return "done"


Closers = dict[int, str]  # id of a connection -> the thread that closed its socket


@pytest.fixture
def closers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Closers]:
    """Which thread closed each connection's socket (the close that found it open)."""
    seen: Closers = {}
    close = Connection.close

    def recorded(self: Connection) -> None:
        if self.sock.fileno() != -1:
            seen.setdefault(id(self), threading.current_thread().name)
        close(self)

    monkeypatch.setattr(Connection, "close", recorded)
    yield seen


def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``check()`` became true within ``timeout`` s (looked at every 10 ms)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _closed_by(closers: Closers, conn: Connection, timeout: float = 10.0) -> str:
    _eventually(lambda: id(conn) in closers, timeout)
    return closers.get(id(conn), "nobody")


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict[str, object]]:
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # the test looks at it
            box["result"] = exc

    thread = threading.Thread(target=run, name="caller")
    thread.start()
    return thread, box


@pytest.fixture
def slow() -> Iterator[tuple[Slow, RPCServer, RPCClient]]:
    keys = RunKeys.generate()
    target = Slow()
    server = RPCServer(target, keys)
    client = RPCClient("slow/0", keys, fixed_resolver(server.address), retry_refused=False)
    yield target, server, client
    client.close()
    server.close()


def test_a_closing_server_leaves_each_connection_to_the_thread_reading_it(
    closers: Closers, slow: tuple[Slow, RPCServer, RPCClient]
) -> None:
    _, server, client = slow
    assert client.ping() == "pong"  # the server's thread for it now waits for the next request
    (conn,) = server._conns
    server.close()
    assert _closed_by(closers, conn).startswith("tlaunch-rpc-")  # its reader, not MainThread


def test_a_closing_client_leaves_a_busy_connection_to_its_call(
    closers: Closers, slow: tuple[Slow, RPCServer, RPCClient]
) -> None:
    target, _, client = slow
    caller, box = _in_thread(lambda: client.slow(0.5))
    assert target.started.wait(10)
    (conn,) = client._pool.busy
    client.close()
    caller.join(10)
    assert isinstance(box["result"], RPCError)  # the call failed: its client closed
    assert _closed_by(closers, conn) == "caller"


def test_a_failing_channel_leaves_its_replies_to_the_thread_reading_them(
    closers: Closers, slow: tuple[Slow, RPCServer, RPCClient]
) -> None:
    target, _, client = slow
    assert client.ping() == "pong"  # resolved: futures go on the channel
    future = client.futures.slow(0.5)
    caller, box = _in_thread(lambda: future.result(10))
    assert target.started.wait(10)
    channel = client._channel
    assert channel is not None
    _eventually(lambda: channel._depth > 0)  # the caller reads the replies
    client.close()
    caller.join(10)
    assert isinstance(box["result"], RPCError)
    assert _closed_by(closers, channel.replies) == "caller"
    # Nobody was writing the requests: the first of the two threads to fail the channel closes them.
    assert _closed_by(closers, channel.requests) in ("MainThread", "caller")


def test_a_write_while_a_connection_is_ended_still_goes_through_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SSLSocket.shutdown`` drops its TLS object before the socket's shutdown: a write by
    another thread in that moment left as plaintext. The connection's end keeps TLS to the last."""
    keys = RunKeys.generate()
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def serve() -> None:
        raw, _ = listener.accept()
        with keys.context(server=True).wrap_socket(raw, server_side=True) as tls:
            try:
                got.append(tls.recv(100))
            except (ssl.SSLError, OSError) as exc:  # plaintext where a TLS record was due
                got.append(repr(exc).encode())

    server = threading.Thread(target=serve)
    server.start()
    sock = keys.context(server=False).wrap_socket(socket.create_connection(listener.getsockname()))
    conn = Connection(sock, "peer")
    real = socket.socket.shutdown

    def racing(self: socket.socket, how: int) -> None:  # another thread writes in that moment
        if self is sock:
            sock.send(b"secret")
        real(self, how)

    monkeypatch.setattr(socket.socket, "shutdown", racing)
    try:
        conn.shutdown()
        server.join(10)
        assert got == [b"secret"]  # decrypted by the peer: it went as a TLS record
    finally:
        conn.close()
        listener.close()


def test_a_replies_side_registered_as_its_server_closes_is_closed(
    monkeypatch: pytest.MonkeyPatch, closers: Closers
) -> None:
    """A channel's replies side that registers after close() looked at the unbound ones, but
    before it ended every connection, is closed all the same (it was left open: its handler
    had handed it over, and close() had not seen it)."""
    keys = RunKeys.generate()
    server = RPCServer(Slow(), keys)
    looked, registered = threading.Event(), threading.Event()
    seen: list[Connection] = []
    register, shutdown = server._register_replies, Connection.shutdown

    def late(conn: Connection, token: bytes) -> bool:
        seen.append(conn)
        assert looked.wait(10)  # close() has looked at the unbound replies sides
        try:
            return register(conn, token)
        finally:
            registered.set()

    def ending(self: Connection) -> None:  # close() ends the connections after it looked
        looked.set()
        registered.wait(10)
        shutdown(self)

    monkeypatch.setattr(server, "_register_replies", late)
    monkeypatch.setattr(Connection, "shutdown", ending)
    replies = connect(server.address, keys.context(server=False), 10.0, greet=False)
    try:
        replies.send(wire.CHANNEL_REPLIES, 0, [b"t" * 16])
        _eventually(lambda: bool(seen))
        server.close()
        assert _closed_by(closers, seen[0]) != "nobody"
    finally:
        replies.close()
        server.close()


class _HeldRelease:
    """A channel's read lock whose holder, once ``hold`` is set, waits for ``go`` before
    letting go: another thread fails the channel while the reader is on its way out."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.hold, self.releasing, self.go = threading.Event(), threading.Event(), threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        if self.hold.is_set() and threading.current_thread().name == "caller":
            self.releasing.set()
            self.go.wait(10)
        self._lock.release()


def test_a_channel_failed_as_its_reader_lets_go_is_closed_by_that_reader(
    closers: Closers, slow: tuple[Slow, RPCServer, RPCClient]
) -> None:
    """fail() finds the read lock held and leaves the replies to the reader; the reader, had
    it looked at ``done`` before letting go, would have left them open."""
    _, _, client = slow
    assert client.ping() == "pong"  # resolved: futures go on the channel
    future = client.futures.slow(0.2)
    channel = client._channel
    assert channel is not None
    lock = _HeldRelease()
    channel.read_lock = lock  # type: ignore[assignment]
    lock.hold.set()
    caller, box = _in_thread(lambda: future.result(10))
    assert lock.releasing.wait(10)  # the reply is read: the caller lets go of the lock
    channel.fail(lambda m: RPCError(f"{m} failed"))  # cannot take the lock: the caller holds it
    assert _closed_by(closers, channel.replies, timeout=0.2) == "nobody"
    lock.go.set()
    caller.join(10)
    assert box["result"] == "done"
    assert _closed_by(closers, channel.replies) == "caller"


def test_a_replaced_channel_reader_leaves_the_requests_to_the_current_one(
    monkeypatch: pytest.MonkeyPatch, closers: Closers, slow: tuple[Slow, RPCServer, RPCClient]
) -> None:
    """A reader replaced during a long call whose reply cannot be sent returns; it does not
    close the requests under the new reader, which is waiting to read them."""
    target, server, client = slow
    assert client.ping() == "pong"  # resolved: futures go on the channel
    flush = server_module._Channel.flush

    def broken(self: server_module._Channel) -> None:
        if threading.current_thread().name != "tlaunch-rpc-channel":  # the replaced reader
            raise BrokenPipeError("the replies side is gone")
        flush(self)

    monkeypatch.setattr(server_module._Channel, "flush", broken)
    client.futures.slow(1.0)
    assert target.started.wait(10)
    (channel,) = server._channels
    assert _eventually(lambda: any(t.name == "tlaunch-rpc-channel" for t in threading.enumerate())), (
        "the stall monitor gave the channel no new reader"
    )
    assert target.ended.wait(10)  # the call ends on the replaced reader, whose flush fails
    time.sleep(0.1)
    assert _closed_by(closers, channel.requests, timeout=0.2) == "nobody"
    client.close()  # the current reader sees the end of the requests and closes them
    assert _closed_by(closers, channel.requests) == "tlaunch-rpc-channel"
