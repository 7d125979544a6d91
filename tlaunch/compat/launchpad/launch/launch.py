"""``launchpad.launch.launch``."""

from tlaunch.launcher import launch

__all__ = ["launch"]
