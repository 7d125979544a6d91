"""``launchpad.launch``."""
