"""``launchpad.launch.test_multi_threading``."""
