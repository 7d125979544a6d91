"""``launchpad.nodes.python.node``."""

from tlaunch.nodes.python import PyClassNode, PyNode

__all__ = ["PyClassNode", "PyNode"]
