"""``launchpad.nodes.multi_threading_colocation.node``."""

from tlaunch.nodes.colocation import MultiThreadingColocation

__all__ = ["MultiThreadingColocation"]
