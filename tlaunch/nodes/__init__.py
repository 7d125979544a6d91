"""Node types of the program graph."""

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
