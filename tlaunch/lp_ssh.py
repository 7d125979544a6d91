"""Launchpad's program API, for one host or many: ``from tlaunch import lp_ssh as lp``.

A Launchpad program ports by changing its import; ``SSHNode`` and
``Node.to_host()`` place nodes on other hosts.
"""

from tlaunch.context import (
    NodeContext,
    get_context,
    register_stop_handler,
    stop,
    stop_event,
    wait_for_stop,
)
from tlaunch.errors import (
    LaunchError,
    ProgramError,
    RemoteError,
    RPCError,
    RunFailedError,
    TLaunchError,
    TransmitStopped,
)
from tlaunch.launcher import LaunchType, Run, launch
from tlaunch.nodes import (
    CourierNode,
    Handle,
    MultiThreadingColocation,
    Node,
    PyClassNode,
    PyNode,
    SSHNode,
    Table,
    TransmitNode,
)
from tlaunch.program import Program, make_program

__all__ = [
    "CourierNode",
    "Handle",
    "LaunchError",
    "LaunchType",
    "MultiThreadingColocation",
    "Node",
    "NodeContext",
    "Program",
    "ProgramError",
    "PyClassNode",
    "PyNode",
    "RPCError",
    "RemoteError",
    "Run",
    "RunFailedError",
    "SSHNode",
    "TLaunchError",
    "Table",
    "TransmitNode",
    "TransmitStopped",
    "get_context",
    "launch",
    "make_program",
    "register_stop_handler",
    "stop",
    "stop_event",
    "wait_for_stop",
]
