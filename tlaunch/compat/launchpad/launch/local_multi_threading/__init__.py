"""``launchpad.launch.local_multi_threading``."""
