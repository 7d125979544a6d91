"""CourierNode: an object whose public methods are served over RPC."""

from __future__ import annotations

from typing import ParamSpec, TypeVar

from tlaunch.nodes.base import NodeRuntime
from tlaunch.nodes.python import PyClassNode

__all__ = ["CourierNode"]

P = ParamSpec("P")
R = TypeVar("R")


class CourierNode(PyClassNode[P, R]):
    """Serves every public method of ``ctor(*args, **kwargs)`` over RPC.

    Its handle dereferences to a client: ``client.method(x)`` calls it and waits,
    ``client.futures.method(x)`` returns a :class:`concurrent.futures.Future`.
    The node serves until the program stops, or until its ``run()`` returns if
    the object has one.
    """

    @property
    def has_handle(self) -> bool:
        return True

    def execute(self, runtime: NodeRuntime) -> None:
        obj, run = self._build(runtime)
        stop_serving = runtime.serve(obj)
        try:
            if run is not None:
                runtime.set_state("running")
                run()
            else:
                runtime.set_state("serving")
                runtime.stop_event().wait()
        finally:
            stop_serving()
