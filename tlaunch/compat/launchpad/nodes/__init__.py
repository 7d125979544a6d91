"""``launchpad.nodes``."""
