"""``launchpad.nodes.courier``."""
