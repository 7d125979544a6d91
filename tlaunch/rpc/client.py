"""RPC client: ``client.method(...)`` and ``client.futures.method(...)``.

The server's address is resolved on first use through a resolver (the run's
coordinator), which waits for a server that is not up yet. Sockets are pooled
per client, one per concurrent caller; ``ZMQ_IMMEDIATE`` means a request is only
queued on a live connection, so a call to a server that went away re-resolves
and goes to its new address instead of waiting on the old one.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import zmq

from tlaunch.errors import RemoteError, ResolveTimeoutError, RPCError, ServerRestartedError
from tlaunch.rpc import wire
from tlaunch.rpc.security import AuthError, Buffer, RunKeys, Sealer

__all__ = ["RPCClient", "Resolver"]

# resolver(previous_address_or_None, timeout) -> address; waits for an address
# different from the previous one.
Resolver = Callable[[str | None, float], str]

_req_ids = itertools.count(1)
_SLICE = 0.5  # seconds between liveness checks while waiting
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _futures_pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(64, thread_name_prefix="tlaunch-futures")
        return _executor


class _Socket:
    __slots__ = ("address", "sock")

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)
        self.sock.connect(f"tcp://{address}")

    def close(self) -> None:
        self.sock.close(0)


class RPCClient:
    """A client of one node's RPC server.

    Args:
        name: the node served (``label/index``), for error messages.
        keys: the run's keys.
        resolver: finds (and re-finds) the server's address.
        resolve_timeout: how long a call waits for the server to be reachable.
        stop_event: when set, calls waiting on an unreachable server give up.
    """

    def __init__(
        self,
        name: str,
        keys: RunKeys,
        resolver: Resolver,
        resolve_timeout: float = 300.0,
        stop_event: threading.Event | None = None,
        default_timeout: float | None = None,
    ) -> None:
        self._name = name
        self._default_timeout = default_timeout
        self._sealer = Sealer(keys)
        self._resolver = resolver
        self._resolve_timeout = resolve_timeout
        self._stop_event = stop_event
        self._address: str | None = None
        self._lock = threading.Lock()
        self._idle: list[_Socket] = []
        self._all: set[_Socket] = set()
        self._closed = False

    # -- public surface -------------------------------------------------
    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)

    @property
    def futures(self) -> _Futures:
        """``client.futures.method(...)`` returns a :class:`concurrent.futures.Future`."""
        return _Futures(self)

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
            RPCError: the reply did not come within ``timeout`` (default: the
                client's ``default_timeout``; None waits as long as the server lives).
        """
        req_id = next(_req_ids)
        frames = self._sealer.seal(wire.REQUEST, req_id, wire.dumps((method, args, kwargs or {})))
        timeout = self._default_timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        sock = self._acquire()
        ok = False
        try:
            sock = self._send(sock, frames, deadline)
            result = self._wait(sock, req_id, method, deadline)
            ok = True
            return result
        finally:
            self._release(sock, ok)

    def close(self) -> None:
        """Close every socket of this client; idempotent."""
        with self._lock:
            self._closed = True
            for s in self._all:
                s.close()
            self._all.clear()
            self._idle.clear()

    # -- internals ------------------------------------------------------
    def _resolve(self, previous: str | None) -> str:
        if self._address is not None and self._address != previous:
            return self._address
        address = self._resolver(previous, self._resolve_timeout)
        self._address = address
        return address

    def _acquire(self) -> _Socket:
        with self._lock:
            if self._closed:
                raise RPCError(f"the client of {self._name!r} is closed")
            if self._idle:
                return self._idle.pop()
        address = self._resolve(None)
        s = _Socket(address)
        with self._lock:
            self._all.add(s)
        return s

    def _release(self, s: _Socket, ok: bool) -> None:
        with self._lock:
            if ok and not self._closed and s.address == self._address:
                self._idle.append(s)
                return
            self._all.discard(s)
        s.close()

    def _replace(self, s: _Socket) -> _Socket:
        new = _Socket(self._resolve(s.address))
        with self._lock:
            self._all.discard(s)
            self._all.add(new)
        s.close()
        return new

    def _send(self, s: _Socket, frames: list[Buffer], deadline: float | None) -> _Socket:
        start = time.monotonic()
        while not s.sock.poll(int(_SLICE * 1000), zmq.POLLOUT):
            # No live connection: the server is not up yet or went away.
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise RPCError(f"call to {self._name!r} at {s.address} timed out before it was sent")
            if self._stop_event is not None and self._stop_event.is_set():
                raise RPCError(f"the program is stopping; {self._name!r} at {s.address} is unreachable")
            if now - start > self._resolve_timeout:
                raise ResolveTimeoutError(
                    f"node {self._name!r} did not accept connections at {s.address} "
                    f"for {self._resolve_timeout:.0f} s"
                )
            try:
                address = self._resolver(s.address, 0.0)
            except ResolveTimeoutError:
                continue
            if address != s.address:
                self._address = address
                s = self._replace(s)
        s.sock.send_multipart(frames, copy=False)
        return s

    def _wait(self, s: _Socket, req_id: int, method: str, deadline: float | None) -> Any:
        while True:
            if s.sock.poll(int(_SLICE * 1000), zmq.POLLIN):
                frames = s.sock.recv_multipart(copy=False)
                try:
                    kind, rid, buffers = self._sealer.open([f.buffer for f in frames])
                except AuthError:
                    continue  # not from our server: ignore
                if rid != req_id:
                    continue  # a late reply to an abandoned call
                payload = wire.loads(buffers)
                if kind == wire.ERROR:
                    type_name, message, tb = payload
                    raise RemoteError(type_name, message, tb, node=self._name)
                return payload
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise RPCError(f"{self._name}.{method}() got no reply in time")
            if self._stop_event is not None and self._stop_event.is_set():
                raise RPCError(f"the program stopped while {self._name}.{method}() was waiting")
            try:
                address = self._resolver(s.address, 0.0)
            except ResolveTimeoutError:
                continue
            if address != s.address:
                self._address = address
                raise ServerRestartedError(
                    f"{self._name!r} was restarted (now at {address}) while "
                    f"{method}() was in flight; the call may or may not have run"
                )

    def __repr__(self) -> str:
        return f"RPCClient({self._name!r})"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(f"an RPC client ({self._name!r}) cannot be pickled; pass the node's handle instead")


class _Method:
    __slots__ = ("_client", "_name")

    def __init__(self, client: RPCClient, name: str) -> None:
        self._client = client
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.call(self._name, args, kwargs)


class _Futures:
    __slots__ = ("_client",)

    def __init__(self, client: RPCClient) -> None:
        self._client = client

    def __getattr__(self, method: str) -> Callable[..., Future[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)
        client = self._client

        def submit(*args: Any, **kwargs: Any) -> Future[Any]:
            return _futures_pool().submit(client.call, method, args, kwargs)

        return submit
