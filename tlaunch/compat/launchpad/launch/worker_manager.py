"""``launchpad.launch.worker_manager``: the calling thread's stop, and nodes run by hand."""

from tlaunch.context import register_stop_handler, stop_event, unregister_stop_handler, wait_for_stop
from tlaunch.nodes.standalone import WorkerManager
from tlaunch.nodes.standalone import worker_manager as get_worker_manager

__all__ = [
    "WorkerManager",
    "get_worker_manager",
    "register_stop_handler",
    "stop_event",
    "unregister_stop_handler",
    "wait_for_stop",
]
