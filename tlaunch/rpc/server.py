"""RPC server: serves an object's public methods over mutually authenticated TLS.

One thread per connection reads a request, runs the method inline and writes
the reply: no hand-off between threads on the hot path. A client makes one
connection per call in flight, so a method that blocks (a queue ``get``) holds
only its own connection. A peer without the run's key fails the TLS handshake
and is dropped before anything it sends is read.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import traceback

from tlaunch.rpc import wire
from tlaunch.rpc.framing import Connection, ProtocolError
from tlaunch.rpc.security import RunKeys

__all__ = ["RPCServer", "error_payload"]

log = logging.getLogger(__name__)
_HANDSHAKE_TIMEOUT = 10.0


def error_payload(exc: BaseException) -> tuple[str, str, str]:
    """(type name, message, formatted traceback) of ``exc``, for the wire."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return name, str(exc), "".join(traceback.format_exception(t, exc, exc.__traceback__))


class RPCServer:
    """Serve ``target``'s public methods (names not starting with ``_``).

    Args:
        target: the object whose methods are called.
        keys: the run's keys; peers without them are refused at the handshake.
        bind_host: interface to bind (port 0: the OS picks a free port).
        advertise_host: host part of :attr:`address` (defaults to ``bind_host``).
    """

    def __init__(
        self,
        target: object,
        keys: RunKeys,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
    ) -> None:
        self._target = target
        self._context = keys.context(server=True)
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind_host, 0))
        self._listener.listen(512)
        port = self._listener.getsockname()[1]
        host = advertise_host or bind_host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.rejected = 0
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="tlaunch-rpc-accept", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                raw, peer = self._listener.accept()
            except OSError:
                return  # closed
            if self._closed:
                raw.close()
                return
            name = f"{peer[0]}:{peer[1]}"
            threading.Thread(
                target=self._serve_connection, args=(raw, name), name=f"tlaunch-rpc-{name}", daemon=True
            ).start()

    def _serve_connection(self, raw: socket.socket, peer: str) -> None:
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.settimeout(_HANDSHAKE_TIMEOUT)
            sock = self._context.wrap_socket(raw, server_side=True)
            sock.settimeout(None)
        except (ssl.SSLError, OSError) as exc:
            with self._lock:
                self.rejected += 1
            log.warning("refused a connection from %s: TLS handshake failed (%s)", peer, exc)
            raw.close()
            return
        conn = Connection(sock, peer)
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._conns.add(conn)
        try:
            while True:
                kind, req_id, buffers = conn.recv()
                if kind != wire.REQUEST:
                    raise ProtocolError(f"{peer} sent message kind {kind}, expected a request")
                reply_kind, payload = self._dispatch(buffers)
                del buffers
                conn.send(reply_kind, req_id, payload)
                del payload
        except EOFError:
            pass
        except (OSError, ProtocolError) as exc:
            if not self._closed:
                log.debug("connection from %s ended: %s", peer, exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _dispatch(self, buffers: list[memoryview]) -> tuple[int, list[wire.Buffer]]:
        try:
            method, args, kwargs = wire.loads(buffers)
            if not isinstance(method, str) or method.startswith("_"):
                raise AttributeError(
                    f"{method!r} is not a public method; only names without a leading '_' can be called"
                )
            fn = getattr(self._target, method, None)
            if fn is None or not callable(fn):
                raise AttributeError(f"{type(self._target).__name__!r} has no public method {method!r}")
            return wire.REPLY, wire.dumps(fn(*args, **kwargs))
        except BaseException as exc:  # the caller gets it as RemoteError
            return wire.ERROR, wire.dumps(error_payload(exc))

    def close(self) -> None:
        """Stop serving and drop every connection; idempotent. Calls in flight get no reply."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = list(self._conns)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._thread.join(5)

    def __enter__(self) -> RPCServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
