"""``launchpad.launch.test_multi_processing``."""
