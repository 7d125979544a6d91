"""``launchpad.stop_program.stop``."""

from tlaunch.context import stop

__all__ = ["stop"]
