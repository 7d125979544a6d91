"""``launchpad.context``: launch types and the node's launch context."""

from tlaunch.context import NodeContext as LaunchContext
from tlaunch.context import get_context
from tlaunch.launch_types import LaunchType, is_local_launch, is_local_launch_or_test

__all__ = ["LaunchContext", "LaunchType", "get_context", "is_local_launch", "is_local_launch_or_test"]
