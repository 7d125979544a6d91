"""``launchpad.program_stopper.program_stopper``."""

from tlaunch.context import make_program_stopper

__all__ = ["make_program_stopper"]
