"""``launchpad.launch.test_multi_threading.address_builder``."""

from __future__ import annotations

from collections.abc import Sequence

from tlaunch.nodes.address import SimpleLocalAddressBuilder
from tlaunch.nodes.base import Node

__all__ = ["bind_addresses"]


def bind_addresses(nodes: Sequence[Node]) -> None:
    """Bind every address of ``nodes`` to a free port of this machine."""
    for node in nodes:
        for address in node.addresses:
            address.bind(SimpleLocalAddressBuilder())
