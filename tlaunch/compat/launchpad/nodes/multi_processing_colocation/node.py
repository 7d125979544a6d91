"""``launchpad.nodes.multi_processing_colocation.node``."""

from tlaunch.nodes.colocation import MultiProcessingColocation

__all__ = ["MultiProcessingColocation"]
