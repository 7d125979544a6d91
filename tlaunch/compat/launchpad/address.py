"""``launchpad.address``."""

from tlaunch.nodes.address import (
    AbstractAddressBuilder,
    Address,
    SimpleLocalAddressBuilder,
    get_port_from_address,
)

__all__ = ["AbstractAddressBuilder", "Address", "SimpleLocalAddressBuilder", "get_port_from_address"]
