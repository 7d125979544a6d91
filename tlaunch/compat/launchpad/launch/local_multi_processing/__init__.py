"""``launchpad.launch.local_multi_processing``."""
