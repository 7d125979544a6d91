"""``launchpad.nodes.courier.node``."""

from tlaunch.nodes.base import Handle as CourierHandle
from tlaunch.nodes.courier import CourierNode
from tlaunch.nodes.courier_server import CourierClient

__all__ = ["CourierClient", "CourierHandle", "CourierNode"]
