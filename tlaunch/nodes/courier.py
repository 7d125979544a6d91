"""CourierNode: an object whose public methods are served over RPC."""

from __future__ import annotations

from typing import Any, ParamSpec, TypeVar

from tlaunch.nodes.address import Address
from tlaunch.nodes.base import NodeRuntime
from tlaunch.nodes.courier_server import CourierServer
from tlaunch.nodes.python import PyClassNode

__all__ = ["CourierNode"]

P = ParamSpec("P")
R = TypeVar("R")


class CourierNode(PyClassNode[P, R]):
    """Serves every public method of ``ctor(*args, **kwargs)`` over RPC.

    Its handle dereferences to a client: ``client.method(x)`` calls it and waits,
    ``client.futures.method(x)`` returns a :class:`concurrent.futures.Future`,
    ``client(x)`` calls the object itself. The node serves until the program
    stops, or until its ``run()`` returns if the object has one.

    As in Launchpad, an object with ``set_courier_server(server)`` gets its
    server instead (it starts and stops it itself), and ``courier_kwargs`` are
    accepted (Launchpad's server options). The node's ``courier_address`` is
    where it listens when bound before it runs (Launchpad's tests); in a
    launch it listens at any free port and its run's coordinator tells the
    handles.
    """

    def __init__(
        self, ctor: Any, *args: Any, courier_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(ctor, *args, **kwargs)
        self._courier_kwargs = dict(courier_kwargs or {})
        self._address = Address("courier")
        self.allocate_address(self._address)

    @property
    def has_handle(self) -> bool:
        return True

    @property
    def courier_address(self) -> Address:
        """Launchpad's address of the node's server."""
        return self._address

    def direct_address(self) -> str | None:
        return self._address.resolve() if self._address.bound else None

    def configure(self, *args: Any, **kwargs: Any) -> None:
        """Set the constructor's arguments anew (Launchpad: cyclic references between nodes)."""
        self._args = args
        self._kwargs = kwargs

    def execute(self, runtime: NodeRuntime) -> None:
        obj, run = self._build(runtime)
        port = int(self._address.resolve().rsplit(":", 1)[1]) if self._address.bound else 0
        if hasattr(obj, "set_courier_server"):  # the object runs its server itself
            obj.set_courier_server(CourierServer(port, instance=obj, serve=runtime.serve))
            runtime.set_state("running" if run is not None else "serving")
            if run is not None:
                run()
            return
        stop_serving = runtime.serve(obj, port)
        try:
            self._run_or_serve(runtime, run)
        finally:
            stop_serving()
