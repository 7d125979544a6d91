"""``launchpad.nodes.python.local_multi_processing``: a group's process settings."""

from tlaunch.backends.local import PythonProcess

__all__ = ["PythonProcess"]
