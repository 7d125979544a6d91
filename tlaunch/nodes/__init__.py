"""Node types of the program graph.

Each type is imported from its module when first asked for: a node process
imports the module of its own node's type only (a CourierNode's does not load
TransmitNode's replay tables and hashing).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    "Handle": "base",
    "Node": "base",
    "NodeRuntime": "base",
    "MultiThreadingColocation": "colocation",
    "CourierNode": "courier",
    "PyClassNode": "python",
    "PyNode": "python",
    "SSHNode": "python",
    "Table": "transmit",
    "TransmitNode": "transmit",
}


def __getattr__(name: str) -> Any:
    """``tlaunch.nodes.CourierNode`` and the like, from their modules (PEP 562)."""
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
