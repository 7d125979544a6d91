"""Launchpad's ``courier`` module: ``Server`` and ``Client`` (tlaunch's RPC, with its keys)."""

from tlaunch.nodes.courier_server import CourierClient as Client
from tlaunch.nodes.courier_server import CourierServer as Server

__all__ = ["Client", "Server"]
