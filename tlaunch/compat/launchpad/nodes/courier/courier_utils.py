"""``launchpad.nodes.courier.courier_utils``."""

from tlaunch.nodes.batching import batched_handler

__all__ = ["batched_handler"]
