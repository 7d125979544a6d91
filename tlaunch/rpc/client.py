"""RPC client: ``client.method(...)`` and ``client.futures.method(...)``.

The server's address is resolved on first use through a resolver (the run's
coordinator), which waits for a server that is not up yet. Each synchronous
call in flight has a connection of its own, taken from a pool; an idle pooled
connection whose server went away is noticed before it is used, and the client
re-resolves and connects to the server's new address by itself. Futures share
one channel per client (see :mod:`tlaunch.rpc.server`): requests leave from the
caller's thread, and the thread that waits for a reply reads it
(:mod:`tlaunch.rpc.channel`).
"""

from __future__ import annotations

import itertools
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tlaunch.errors import RemoteError, ResolveTimeoutError, RPCError, ServerRestartedError, TLaunchError
from tlaunch.rpc import wire
from tlaunch.rpc.framing import Connection, ProtocolError
from tlaunch.rpc.opening import connect
from tlaunch.rpc.pool import Pool
from tlaunch.rpc.security import RunKeys

if TYPE_CHECKING:
    from concurrent.futures import Future

    from tlaunch.rpc.channel import Channel

__all__ = ["RPCClient", "Resolver", "direct_client", "fixed_resolver"]

# resolver(previous_address_or_None, timeout) -> an address other than previous;
# raises ResolveTimeoutError when there is none within timeout.
Resolver = Callable[[str | None, float], str]


def fixed_resolver(address: str) -> Resolver:
    """A resolver for a server that never moves (the coordinator)."""

    def resolve(previous: str | None, timeout: float) -> str:
        if previous == address:
            raise ResolveTimeoutError(f"{address} is the only address")
        return address

    return resolve


def direct_client(name: str, address: str, keys: RunKeys) -> RPCClient:
    """A client of the server at ``address``, found without a coordinator (it may not be up yet)."""
    return RPCClient(name, keys, fixed_resolver(address), resolve_timeout=60.0)


_req_ids = itertools.count(1)
_SLICE = 0.5  # seconds between liveness checks while waiting
_CONNECT_TIMEOUT = 10.0


class RPCClient:
    """A client of one node's RPC server.

    Args:
        name: the node served (``label/index``), for error messages.
        keys: the run's keys.
        resolver: finds (and re-finds) the server's address.
        resolve_timeout: how long a call waits for the server to be reachable.
        stop_event: when set, calls waiting on an unreachable server give up.
        default_timeout: reply timeout of calls that give none (None: wait while
            the server lives).
        retry_refused: keep trying a server that refuses connections (it may be
            restarting); False fails at once (a server that never moves).
        shared_memory: large buffers to and from a server on this host may go as
            sealed memory files (each connection greets the server: a round trip);
            False for a client whose messages are small (the coordinator's).
        tls_server: this client takes the TLS server's part in each handshake: a
            coordinator's clients, whose server takes the client's (see
            :class:`~tlaunch.rpc.server.RPCServer`).
    """

    def __init__(
        self,
        name: str,
        keys: RunKeys,
        resolver: Resolver,
        resolve_timeout: float = 300.0,
        stop_event: threading.Event | None = None,
        default_timeout: float | None = None,
        retry_refused: bool = True,
        shared_memory: bool = True,
        tls_server: bool = False,
    ) -> None:
        self._name = name
        self._retry_refused = retry_refused
        self._resolver = resolver
        self._resolve_timeout = resolve_timeout
        self._stop_event = stop_event
        self._default_timeout = default_timeout
        # How it connects, no reference to the client: a dropped client is finalized at once.
        self._open = _opener(keys.context(server=tls_server), shared_memory, tls_server)
        self._pool = Pool(name, self._open)
        self._channel: Channel | None = None
        self._channel_lock = threading.Lock()
        self._futures = _Futures(self)
        # A client dropped without close() (handles' clients usually are) closes its connections
        # (its pool holds no reference to it). Its futures channel closes at the reactor's next
        # sweep, see Channel.sweep.
        weakref.finalize(self, self._pool.close)

    # -- public surface -------------------------------------------------
    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the served object itself (its ``__call__``)."""
        return self.call("__call__", args, kwargs)

    @property
    def futures(self) -> _Futures:
        """``client.futures.method(...)`` returns a :class:`concurrent.futures.Future`."""
        return self._futures

    def call(
        self,
        method: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Call ``method(*args, **kwargs)`` remotely and return its result.

        Raises:
            RemoteError: the method raised; carries the remote traceback.
            ResolveTimeoutError: the server was not reachable in time.
            ServerRestartedError: the server was replaced during the call.
            RPCError: no reply within ``timeout`` (default: the client's
                ``default_timeout``), or the connection was lost.
        """
        timeout = self._default_timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        payload = wire.dumps((method, args, kwargs or {}))
        req_id = next(_req_ids)
        conn = self._acquire(deadline)
        ok = False
        try:
            try:
                conn.send(wire.REQUEST, req_id, payload)
            except OSError as exc:
                raise self._lost(conn.peer, method, exc) from exc
            del payload
            result = self._wait(conn, req_id, method, deadline)
            ok = True
            return result
        finally:
            self._pool.give_back(conn, ok)

    def close(self) -> None:
        """Close every connection of this client; idempotent."""
        self._pool.close()
        with self._channel_lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.fail(lambda m: RPCError(f"the client of {self._name!r} was closed during {m}()"))

    def idle_descriptors(self) -> list[int]:
        """The descriptors of this client's idle connections: what a process forked to go on with
        them keeps open (:meth:`hand_off`)."""
        return self._pool.idle_descriptors()

    def hand_off(self) -> None:
        """Leave this client's idle connections to a process just forked with them (a supervisor's
        to its node, whose copy of this client goes on with them): give them up here without a
        word to the server (:meth:`Pool.hand_off`); the next call here opens another."""
        self._pool.hand_off()

    def connect_ahead(self, address: str) -> None:
        """Open a connection to ``address`` now, in a thread of its own, for the next call; a
        call made meanwhile takes it rather than opening another (:meth:`Pool.open_ahead`)."""
        self._pool.open_ahead(address)

    def start(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[Any]:
        """Send ``method(*args, **kwargs)`` now; its future completes when the reply comes."""
        if self._pool.address is None or self._pool.closed:
            return _pool(self.call, method, args, kwargs)  # may wait for the server to come up
        payload = wire.dumps((method, args, kwargs))
        channel = self._channel
        try:
            if channel is None or channel.done or channel.peer != self._pool.address:
                channel = self._futures_channel()
            return channel.start(method, payload)
        except (OSError, RPCError):
            # No channel to this address (the server is restarting, or gone): the
            # pool waits for it as a synchronous call would.
            return _pool(self.call, method, args, kwargs)

    # -- the futures channel ----------------------------------------------
    def _futures_channel(self) -> Channel:
        with self._channel_lock:
            channel = self._channel
            if channel is not None and not channel.done and channel.peer == self._pool.address:
                return channel
            address = self._pool.address
            if address is None or self._pool.closed:
                raise OSError("no server address")
            self._channel = channel = self._open_channel(address)
        return channel

    def _open_channel(self, address: str) -> Channel:
        # The futures machinery (with concurrent.futures, ~2 ms) loads at a process's first
        # future: a node or a supervisor that never asks for one does not pay for it as it starts.
        from tlaunch.rpc.opening import open_channel

        return open_channel(self, address, lambda: self._open(address))

    # -- connections ----------------------------------------------------
    def _acquire(self, deadline: float | None) -> Connection:
        return self._pool.take_idle() or self._connect(deadline)

    def _connect(self, deadline: float | None) -> Connection:
        start = time.monotonic()
        address = self._pool.address or self._resolve(None, self._resolve_timeout)
        conn = self._pool.take_ahead(_CONNECT_TIMEOUT)  # one on its way (connect_ahead): open none
        if conn is not None:
            return conn
        address = self._pool.address or address
        error: OSError
        while True:
            try:
                conn = self._open(address)
                self._pool.address = address
                self._pool.add_busy(conn)
                return conn
            except ssl.SSLError as exc:
                raise RPCError(
                    f"TLS handshake with {self._name!r} at {address} failed ({exc}); the "
                    "server does not hold this run's keys"
                ) from exc
            except ConnectionRefusedError as exc:
                if not self._retry_refused:
                    raise RPCError(f"{self._name!r} at {address} refused the connection: it is gone") from exc
                error = exc
            except OSError as exc:
                error = exc
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise RPCError(f"call to {self._name!r} timed out: {address} unreachable ({error})")
            if self._stop_event is not None and self._stop_event.is_set():
                raise RPCError(f"the program is stopping; {self._name!r} at {address} is unreachable")
            if now - start > self._resolve_timeout:
                raise ResolveTimeoutError(
                    f"node {self._name!r} did not accept connections at {address} for "
                    f"{self._resolve_timeout:.0f} s ({error})"
                )
            try:
                address = self._resolve(address, min(1.0, self._resolve_timeout))
            except ResolveTimeoutError:
                time.sleep(0.05)

    def _resolve(self, previous: str | None, timeout: float) -> str:
        address = self._resolver(previous, timeout)
        self._pool.address = address
        return address

    # -- replies --------------------------------------------------------
    def _wait(self, conn: Connection, req_id: int, method: str, deadline: float | None) -> Any:
        while True:
            try:
                if conn.readable(_SLICE):
                    return self._read_reply(conn, req_id, method)
            except (OSError, EOFError, ProtocolError) as exc:
                raise self._lost(conn.peer, method, exc) from exc
            if deadline is not None and time.monotonic() > deadline:
                raise RPCError(f"{self._name}.{method}() got no reply in time")
            error = self._check(conn.peer, method)
            if error is not None:
                raise error

    def _read_reply(self, conn: Connection, req_id: int, method: str) -> Any:
        kind, rid, buffers = conn.recv()
        if rid != req_id:
            raise ProtocolError(f"reply {rid} to request {req_id}")
        return self._result(kind, buffers)

    def _result(self, kind: int, buffers: list[memoryview]) -> Any:
        """The value of a reply, or its remote error raised."""
        payload = wire.loads(buffers)
        if kind == wire.ERROR:
            type_name, message, tb = payload
            raise RemoteError(type_name, message, tb, node=self._name)
        return payload

    def _stopping(self, method: str) -> RPCError | None:
        if self._stop_event is not None and self._stop_event.is_set():
            return RPCError(f"the program stopped while {self._name}.{method}() was waiting")
        return None

    def _check(self, peer: str, method: str) -> RPCError | None:
        """Why a call still waiting on a connection to ``peer`` cannot succeed, or None."""
        return self._stopping(method) or self._moved(peer, method)

    def _lost(self, peer: str, method: str, exc: BaseException) -> RPCError:
        return self._moved(peer, method) or RPCError(
            f"the connection to {self._name!r} at {peer} was lost during {method}() "
            f"({exc or type(exc).__name__}); the call may or may not have run"
        )

    def _moved(self, peer: str, method: str) -> ServerRestartedError | None:
        """The error for a call in flight if the server now lives elsewhere, else None."""
        try:
            address = self._resolver(peer, 0.0)
        except TLaunchError:  # no new address (or its node failed: the caller's next call says so)
            return None
        self._pool.address = address
        return ServerRestartedError(
            f"{self._name!r} was restarted (now at {address}) while {method}() was in "
            "flight; the call may or may not have run"
        )

    def __repr__(self) -> str:
        return f"RPCClient({self._name!r})"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(f"an RPC client ({self._name!r}) cannot be pickled; pass the node's handle instead")


def _opener(context: ssl.SSLContext, greet: bool, tls_server: bool) -> Callable[[str], Connection]:
    """How a client opens a connection (:func:`~tlaunch.rpc.opening.connect`)."""

    def open_connection(address: str) -> Connection:
        return connect(address, context, _CONNECT_TIMEOUT, greet, tls_server)

    return open_connection


class _Method:
    __slots__ = ("_client", "_name")

    def __init__(self, client: RPCClient, name: str) -> None:
        self._client = client
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.call(self._name, args, kwargs)


class _Futures:
    """``client.futures``: each method, once looked up, stays as an attribute."""

    def __init__(self, client: RPCClient) -> None:
        self._client = client

    def __call__(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """A future of a call of the served object itself."""
        return self._client.start("__call__", args, kwargs)

    def __getattr__(self, method: str) -> Callable[..., Future[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)
        client_start = self._client.start

        def start(*args: Any, **kwargs: Any) -> Future[Any]:
            return client_start(method, args, kwargs)

        setattr(self, method, start)
        return start


def _pool(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """:func:`tlaunch.rpc.futures.submit`, loaded at its first use (see ``_open_channel``)."""
    from tlaunch.rpc.futures import submit

    return submit(fn, *args)
