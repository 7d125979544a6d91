"""Thread backend (``local_mt``, ``test_mt``): every node is a thread of the launcher.

The smallest backend, and the model for new ones (``docs/backends.md``): the
coordinator stays in the launcher's process, each node runs in a thread under
its restart policy, and ``stop`` waits for the threads. Nodes still talk over
RPC on loopback, exactly as they do across processes, so a program behaves the
same under every launch type. Threads cannot be killed: ``stop`` waits for
nodes to notice the stop event, and reports the ones that did not.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (see below)
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from tlaunch.backends.base import BackendOptions, NoOptions, Placement, RunSpec
from tlaunch.backends.traits import BackendTraits
from tlaunch.errors import LaunchError
from tlaunch.plan import LaunchPlan
from tlaunch.runtime.in_process import InProcessCoordinator, execute_node
from tlaunch.runtime.restarts import RestartPolicy, supervise

__all__ = ["ThreadBackend"]

# Node threads load the futures machinery on their first future. When the
# launcher's main thread has returned (``lp.launch`` under ``local_mt`` does
# not block), Python is already shutting its threads down, and
# ``concurrent.futures.thread`` refuses to load then ("can't register atexit
# after shutdown"). Loading it here, with the backend, keeps it out of the
# node threads' way.

log = logging.getLogger(__name__)


class ThreadBackend(BackendTraits):
    """Runs each node of a plan in a daemon thread of this process."""

    name: ClassVar[str] = "local_mt"
    terminals: ClassVar[tuple[str, ...]] = ("current_terminal",)
    placement: ClassVar[Placement] = "threads"
    can_detach: ClassVar[bool] = False
    Options: ClassVar[type[BackendOptions]] = NoOptions

    def __init__(self, plan: LaunchPlan, terminal: str, options: Any = None) -> None:
        if terminal not in self.terminals:
            raise LaunchError(
                f"terminal {terminal!r} needs node processes; with launch_type {self.name!r} "
                "nodes are threads that write to this terminal: use launch_type='local_mp'"
            )
        self._threads: dict[str, threading.Thread] = {}
        self._exceptions: dict[str, BaseException] = {}
        self.record: dict[str, Any] = {"hosts": ["localhost"]}

    @property
    def exceptions(self) -> Mapping[str, BaseException]:
        """The exception each failed node raised (its last attempt's)."""
        return self._exceptions

    def prepare(self, run: RunSpec) -> None:
        """Nothing to check: the nodes are objects of this process."""

    def start(self, run: RunSpec) -> InProcessCoordinator:
        coordinator = run.coordinator_here()
        for spec in run.plan.nodes:
            self._threads[spec.key] = threading.Thread(
                target=self._body,
                args=(run, coordinator, spec.key),
                name=f"tlaunch-node-{spec.key}",
                daemon=True,
            )
        for t in self._threads.values():
            t.start()
        return coordinator

    def _body(self, run: RunSpec, coordinator: InProcessCoordinator, key: str) -> None:
        config = run.config()._replace(debug=run.env.get("TLAUNCH_DEBUG"))  # launch(debug=): node_env()
        stopping = threading.Event()

        def attempt(n: int) -> int:
            error = execute_node(run.nodes[key], key, config, coordinator, stopping)
            if error is None:
                return 0
            self._exceptions[key] = error
            return 1

        supervise(key, run.restarts.get(key, RestartPolicy()), attempt, stopping, coordinator)

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

    def detach(self) -> None:
        raise LaunchError("a run of threads cannot outlive its launcher")
