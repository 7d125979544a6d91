"""``launchpad.nodes.multi_threading_colocation``."""
