"""``launchpad.program_stopper``."""
