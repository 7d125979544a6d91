"""Launchpad's program API, for one host or many: ``from tlaunch import lp_ssh as lp``.

A Launchpad program ports by changing its import (``import launchpad as lp``
becomes this module); ``SSHNode`` and ``Node.to_host()`` place nodes on other
hosts. Launchpad's deeper modules (``launchpad.launch.worker_manager``...) and
``courier`` live in :mod:`tlaunch.compat`, which can also alias ``launchpad``
itself, so that a program runs with no change at all (``docs/launchpad.md``).
"""

from tlaunch import context, flags
from tlaunch.backends.local import PythonProcess
from tlaunch.context import (
    NodeContext,
    ProgramStopper,
    get_context,
    make_program_stopper,
    register_stop_handler,
    stop,
    stop_event,
    unregister_stop_handler,
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
from tlaunch.flags import LAUNCH_TYPE
from tlaunch.launch_types import is_local_launch, is_local_launch_or_test
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
from tlaunch.nodes.address import (
    AbstractAddressBuilder,
    Address,
    SimpleLocalAddressBuilder,
    get_port_from_address,
)
from tlaunch.nodes.base import Handle as CourierHandle
from tlaunch.nodes.batching import batched_handler
from tlaunch.nodes.colocation import MultiProcessingColocation
from tlaunch.nodes.courier_server import CourierClient
from tlaunch.program import Program, make_program

__all__ = [
    "AbstractAddressBuilder",
    "Address",
    "CourierClient",
    "CourierHandle",
    "CourierNode",
    "Handle",
    "LAUNCH_TYPE",
    "LaunchError",
    "LaunchType",
    "MultiProcessingColocation",
    "MultiThreadingColocation",
    "Node",
    "NodeContext",
    "Program",
    "ProgramError",
    "ProgramStopper",
    "PyClassNode",
    "PyNode",
    "PythonProcess",
    "RPCError",
    "RemoteError",
    "Run",
    "RunFailedError",
    "SSHNode",
    "SimpleLocalAddressBuilder",
    "TLaunchError",
    "Table",
    "TransmitNode",
    "TransmitStopped",
    "batched_handler",
    "context",
    "flags",
    "get_context",
    "get_port_from_address",
    "is_local_launch",
    "is_local_launch_or_test",
    "launch",
    "make_program",
    "make_program_stopper",
    "register_stop_handler",
    "stop",
    "stop_event",
    "unregister_stop_handler",
    "wait_for_stop",
]
