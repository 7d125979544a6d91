"""``launchpad.nodes.python``."""
