"""``launchpad.program``."""

from tlaunch.program import Program, make_program

__all__ = ["Program", "make_program"]
