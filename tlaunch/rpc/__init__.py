"""Node-to-node RPC over mutually authenticated TLS (per-run keys)."""

from tlaunch.rpc.client import RPCClient
from tlaunch.rpc.security import RunKeys
from tlaunch.rpc.server import RPCServer

__all__ = ["RPCClient", "RPCServer", "RunKeys"]
