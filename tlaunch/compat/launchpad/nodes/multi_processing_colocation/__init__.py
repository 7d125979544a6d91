"""``launchpad.nodes.multi_processing_colocation``."""
