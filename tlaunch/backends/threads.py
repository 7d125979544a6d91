"""Thread backend (``local_mt``, ``test_mt``): every node is a thread of the launcher.

Nodes still talk over RPC on loopback, exactly as they do across processes, so
a program behaves the same under every launch type. Threads cannot be killed:
``stop`` waits for nodes to notice the stop event, and reports the ones that
did not.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback

from tlaunch import context
from tlaunch.nodes.base import Node
from tlaunch.plan import LaunchPlan
from tlaunch.runtime.coordinator import Coordinator
from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig

__all__ = ["ThreadBackend"]

log = logging.getLogger(__name__)


class ThreadBackend:
    """Runs each node of a plan in a daemon thread of this process."""

    def __init__(self, coordinator: Coordinator, config: RuntimeConfig, nodes: dict[str, Node]) -> None:
        self._coord = coordinator
        self._config = config
        self._nodes = nodes
        self._threads: dict[str, threading.Thread] = {}
        self.exceptions: dict[str, BaseException] = {}

    def launch(self, plan: LaunchPlan) -> None:
        for spec in plan.nodes:
            t = threading.Thread(
                target=self._body, args=(spec.key,), name=f"tlaunch-node-{spec.key}", daemon=True
            )
            self._threads[spec.key] = t
        for t in self._threads.values():
            t.start()

    def _body(self, key: str) -> None:
        runtime = NodeRuntime(self._config, self._coord, key)
        context.install(runtime, thread_only=True)
        self._coord.node_started(key, threading.get_native_id(), 0)
        runtime.start_watcher()
        try:
            self._nodes[key].execute(runtime)
        except BaseException as exc:
            self.exceptions[key] = exc
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self._coord.node_finished(key, False, tb, 1)
        else:
            self._coord.node_finished(key, True)
        finally:
            runtime.close()
            context.uninstall_if(runtime)

    def stop(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for key, t in self._threads.items():
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.warning(
                    "node %r did not return within %.1f s of the stop; its thread is left "
                    "running (threads cannot be killed: check stop_event() in loops)",
                    key,
                    grace,
                )
