"""``launchpad.flags``: ``--lp_launch_type``, ``--lp_terminal``, ``--lp_termination_notice_secs``."""

from tlaunch.flags import FLAGS, LAUNCH_TYPE, TERMINAL, TERMINATION_NOTICE

__all__ = ["FLAGS", "LAUNCH_TYPE", "TERMINAL", "TERMINATION_NOTICE"]
