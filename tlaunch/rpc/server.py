"""RPC server: serves an object's public methods on a ZeroMQ ROUTER socket.

One I/O thread owns the socket; each call runs in a worker thread (so a method
that blocks, such as a queue ``get``, never stalls other callers) and its reply
returns to the I/O thread over an in-process socket. Messages that fail
authentication are dropped before anything in them is unpickled.
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from tlaunch.rpc import wire
from tlaunch.rpc.security import AuthError, RunKeys, Sealer

__all__ = ["RPCServer", "error_payload"]

log = logging.getLogger(__name__)
_ids = itertools.count()


def error_payload(exc: BaseException) -> tuple[str, str, str]:
    """(type name, message, formatted traceback) of ``exc``, for the wire."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return name, str(exc), "".join(traceback.format_exception(t, exc, exc.__traceback__))


class RPCServer:
    """Serve ``target``'s public methods (names not starting with ``_``).

    Args:
        target: the object whose methods are called.
        keys: the run's keys; messages not sealed with them are dropped.
        bind_host: interface to bind (port 0: the OS picks a free port).
        advertise_host: host part of :attr:`address` (defaults to ``bind_host``).
        max_workers: most calls running at once.
    """

    def __init__(
        self,
        target: object,
        keys: RunKeys,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        max_workers: int = 256,
    ) -> None:
        self._target = target
        self._sealer = Sealer(keys)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._router = ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        port = self._router.bind_to_random_port(f"tcp://{bind_host}")
        self.address = f"{advertise_host or bind_host}:{port}"
        inproc = f"inproc://tlaunch-rpc-{next(_ids)}-{id(self)}"
        self._pull = ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(inproc)
        self._push = ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.connect(inproc)
        self._push_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="tlaunch-rpc")
        self.rejected = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="tlaunch-rpc-io", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if self._router in events:
                    while True:
                        try:
                            frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._pool.submit(self._handle, frames)
                if self._pull in events:
                    while True:
                        try:
                            out = self._pull.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        if len(out) == 1:  # the stop signal
                            return
                        self._router.send_multipart(out, copy=False)
        finally:
            self._router.close(0)
            self._pull.close(0)

    def _handle(self, frames: list[zmq.Frame]) -> None:
        ident = frames[0]
        try:
            kind, req_id, buffers = self._sealer.open([f.buffer for f in frames[1:]])
            if kind != wire.REQUEST:
                raise AuthError(f"unexpected message kind {kind}")
        except AuthError as exc:
            self.rejected += 1
            log.warning("dropped an unauthenticated RPC message: %s", exc)
            return
        try:
            method, args, kwargs = wire.loads(buffers)
            del buffers
            result = self._call(method, args, kwargs)
            reply = self._sealer.seal(wire.REPLY, req_id, wire.dumps(result))
        except BaseException as exc:  # the caller gets it as RemoteError
            reply = self._sealer.seal(wire.ERROR, req_id, wire.dumps(error_payload(exc)))
        self._send([ident, *reply])

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not isinstance(method, str) or method.startswith("_"):
            raise AttributeError(
                f"{method!r} is not a public method; only names without a leading '_' can be called"
            )
        fn = getattr(self._target, method, None)
        if fn is None or not callable(fn):
            raise AttributeError(f"{type(self._target).__name__!r} has no public method {method!r}")
        return fn(*args, **kwargs)

    def _send(self, frames: list[Any]) -> None:
        with self._push_lock:
            if not self._closed:
                self._push.send_multipart(frames, copy=False)

    def close(self) -> None:
        """Stop serving; idempotent. Calls in flight get no reply."""
        with self._push_lock:
            if self._closed:
                return
            self._closed = True
            self._push.send(b"")
        self._thread.join(5)
        with self._push_lock:
            self._push.close(0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> RPCServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
