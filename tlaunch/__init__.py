"""tlaunch: write a distributed program as a graph of nodes, run it on many hosts.

The Launchpad-style API lives in :mod:`tlaunch.lp_ssh`::

    from tlaunch import lp_ssh as lp

``tlaunch.set_trace()`` (or ``breakpoint()``) in a node pauses it for ``tlaunch debug``.
"""

from tlaunch.errors import (
    BatchJobError,
    CheckpointError,
    CommandError,
    DebugError,
    HostKeyError,
    HostsError,
    LaunchError,
    PicklingError,
    ProgramError,
    RemoteError,
    ResolveTimeoutError,
    RPCError,
    RunFailedError,
    ServerRestartedError,
    SSHError,
    StopError,
    TLaunchError,
    TransmitStopped,
)
from tlaunch.runtime.debugger import set_trace

__version__ = "0.1.0"

__all__ = [
    "BatchJobError",
    "CheckpointError",
    "CommandError",
    "DebugError",
    "HostKeyError",
    "HostsError",
    "LaunchError",
    "PicklingError",
    "ProgramError",
    "RPCError",
    "RemoteError",
    "ResolveTimeoutError",
    "RunFailedError",
    "SSHError",
    "ServerRestartedError",
    "StopError",
    "TLaunchError",
    "TransmitStopped",
    "__version__",
    "set_trace",
]
