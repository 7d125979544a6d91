"""Node-to-node RPC over pyzmq, sealed with the run's keys."""

from tlaunch.rpc.client import RPCClient
from tlaunch.rpc.security import RunKeys
from tlaunch.rpc.server import RPCServer

__all__ = ["RPCClient", "RPCServer", "RunKeys"]
