"""``launchpad.nodes.base``."""

from tlaunch.nodes.base import Handle, Node

__all__ = ["Handle", "Node"]
