"""``launchpad.stop_program``."""
