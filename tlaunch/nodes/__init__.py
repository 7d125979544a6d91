"""Node types of the program graph.

Each type is imported from its module when first asked for: a node process
imports the module of its own node's type only (a CourierNode's does not load
TransmitNode's replay tables and hashing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tlaunch.lazy import lazy_exports

if TYPE_CHECKING:
    from tlaunch.nodes.base import Handle, Node, NodeRuntime
    from tlaunch.nodes.colocation import MultiThreadingColocation
    from tlaunch.nodes.courier import CourierNode
    from tlaunch.nodes.python import PyClassNode, PyNode, SSHNode
    from tlaunch.nodes.transmit import Table, TransmitNode

__all__ = [
    "CourierNode",
    "Handle",
    "MultiThreadingColocation",
    "Node",
    "NodeRuntime",
    "PyClassNode",
    "PyNode",
    "SSHNode",
    "Table",
    "TransmitNode",
]

_MODULES = {
    "Handle": ".base",
    "Node": ".base",
    "NodeRuntime": ".base",
    "MultiThreadingColocation": ".colocation",
    "CourierNode": ".courier",
    "PyClassNode": ".python",
    "PyNode": ".python",
    "SSHNode": ".python",
    "Table": ".transmit",
    "TransmitNode": ".transmit",
}

__getattr__ = lazy_exports(__name__, _MODULES, globals())
"""``tlaunch.nodes.CourierNode`` and the like, from their modules (PEP 562)."""


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
