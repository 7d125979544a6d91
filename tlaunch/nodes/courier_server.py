"""A server of functions bound by name, started and stopped by its owner (Launchpad's ``courier.Server``).

A ``CourierNode`` whose object has ``set_courier_server()`` hands it one of
these for the object's methods (the object starts and stops it); programs
written against Launchpad's ``courier`` module make them directly. Either way
the server is tlaunch's: mutual TLS with the run's keys (outside a run, this
process's own).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from tlaunch import context
from tlaunch.rpc.client import RPCClient, fixed_resolver
from tlaunch.rpc.server import RPCServer, StopServing

__all__ = ["CourierClient", "CourierServer"]

Serve = Callable[[object, int], StopServing]
STOP_DRAIN = 5.0  # s the calls running when Stop() is called get to send their replies


class CourierServer:
    """Serves what is bound to it, from :meth:`Start` to :meth:`Stop`.

    Args:
        port: the port to listen at (None: any free one).
        instance: serve this object's public methods (default: only what is bound).
        serve: how to serve (a node's runtime registers the server with its run);
            default: a server of its own.
        **kwargs: Launchpad's other options (``thread_pool_size``...), accepted.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        instance: object | None = None,
        serve: Serve | None = None,
        **kwargs: Any,
    ) -> None:
        self._target = instance if instance is not None else types.SimpleNamespace()
        self._port = port or 0
        self._serve = serve
        self._stop: StopServing | None = None
        self.address: str | None = None

    def Bind(self, method: str, handler: Callable[..., Any]) -> None:
        """Serve ``handler`` as ``method``."""
        setattr(self._target, method, handler)

    def Start(self) -> None:
        """Start serving (idempotent)."""
        if self._stop is not None:
            return
        if self._serve is not None:
            self._stop = self._serve(self._target, self._port)
            return
        runtime = context.current_or_none()
        bind = getattr(getattr(runtime, "config", None), "bind_host", "127.0.0.1")
        server = RPCServer(self._target, context.current_keys(), bind, port=self._port)
        self.address, self._stop = server.address, server.close

    def Stop(self) -> None:
        """Stop serving (idempotent); calls already running finish first (up to :data:`STOP_DRAIN` s)."""
        stop, self._stop = self._stop, None
        if stop is not None:
            stop(drain=STOP_DRAIN)

    def Join(self) -> None:
        """Nothing to wait for: :meth:`Stop` returns once the server is closed."""

    start, stop, join = Start, Stop, Join


class _AnyClient(type):
    """Every RPC client is a ``CourierClient`` to ``isinstance``, as every Launchpad client is."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, RPCClient)


class CourierClient(RPCClient, metaclass=_AnyClient):
    """A client of the server at ``address`` (``host:port``), with the keys of the calling code's run.

    Launchpad's ``lp.CourierClient`` / ``courier.Client``; the clients that
    handles dereference to are instances of it too (``isinstance``).
    """

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, context.current_keys(), fixed_resolver(address), resolve_timeout=60.0)
