"""A run's coordinator in the launcher's own process, optionally served over RPC.

The local backends keep their coordinator here: node threads call it directly,
node processes reach it over RPC on loopback (sealed with the run's keys). It
offers the launcher the same surface as a coordinator on a head host
(:class:`~tlaunch.runtime.remote.RemoteCoordinator`), so :class:`~tlaunch.run.Run`
does not care where its coordinator lives.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from tlaunch import context
from tlaunch.nodes.base import Node
from tlaunch.plan import LaunchPlan
from tlaunch.rpc.security import RunKeys
from tlaunch.rpc.server import RPCServer
from tlaunch.runtime import debugger
from tlaunch.runtime.coordinator import CLOSE_DRAIN, Coordinator, NodeRecord
from tlaunch.runtime.node_runtime import NodeRuntime, RuntimeConfig
from tlaunch.runtime.states import REQUESTED

__all__ = ["InProcessCoordinator", "execute_node"]

log = logging.getLogger(__name__)


class InProcessCoordinator:
    """A :class:`Coordinator` of this process and, once :meth:`serve` was called, its RPC server.

    Only the coordinator's own methods are served: :meth:`close` and
    :meth:`serve` are not reachable from nodes.
    """

    def __init__(
        self, plan: LaunchPlan, on_failure: str = "stop", stop_grace: float = 5.0, failure_grace: float = 1.0
    ) -> None:
        self.coordinator = _Watched(plan, on_failure, stop_grace, failure_grace)
        self._server: RPCServer | None = None
        self.address: str | None = None

    def serve(self, keys: RunKeys, bind_host: str = "127.0.0.1", advertise_host: str | None = None) -> str:
        """Serve the coordinator to node processes; returns its address."""
        if self._server is None:
            self._server = RPCServer(self.coordinator, keys, bind_host, advertise_host, tls_client=True)
            self.address = self._server.address
        return self._server.address

    # -- what Run uses --------------------------------------------------
    def status(self) -> dict[str, dict[str, Any]]:
        """Every node's record, as plain dicts."""
        return self.coordinator.status()

    def summary(self) -> dict[str, Any]:
        """Status, stop reason and first failure in one answer."""
        return self.coordinator.summary()

    @property
    def stopping(self) -> bool:
        """Whether the run is stopping or stopped."""
        return self.coordinator.stopping

    @property
    def stop_reason(self) -> str | None:
        """Why the run stopped."""
        return self.coordinator.stop_reason

    @property
    def failure(self) -> NodeRecord | None:
        """The first node to fail."""
        return self.coordinator.failure

    @property
    def stop_kind(self) -> str | None:
        """Why the stop began (:data:`~tlaunch.runtime.coordinator.STOP_KINDS`)."""
        return self.coordinator.stop_kind

    def stop(self, reason: str = "stop() was called", kind: str = REQUESTED) -> None:
        """Ask every node to stop."""
        self.coordinator.stop(reason, kind)

    def stop_grace(self) -> float:
        """Seconds nodes get after the current stop (see :meth:`Coordinator.stop_grace`)."""
        return self.coordinator.stop_grace()

    def wait_stopping(self, timeout: float | None) -> bool:
        """Wait until the run is stopping; False on timeout."""
        return self.coordinator.wait_stopping(timeout)

    def wait_ready(self, keys: list[str] | None, timeout: float | None) -> bool:
        """Wait until every node of ``keys`` (None: all) is up; False on timeout or a stop first."""
        return self.coordinator.wait_ready(keys, timeout)

    def wait_ended(self, timeout: float) -> bool:
        """Wait until every node has ended; False on timeout."""
        return self.coordinator.wait_ended(timeout)

    def release(self) -> None:
        """Nothing waits for the launcher here: the coordinator ends with it."""

    def detach(self) -> None:
        """A coordinator in the launcher's process cannot go on without it."""
        raise NotImplementedError("a coordinator in the launcher's process ends with the launcher")

    def close(self) -> None:
        """Stop serving; idempotent."""
        if self._server is not None:
            self._server.close(drain=CLOSE_DRAIN)

    # -- what the launcher's own runtime calls ----------------------------
    def resolve(self, key: str, previous: str | None, timeout: float) -> dict[str, Any]:
        """Wait for an address of node ``key`` (see :meth:`Coordinator.resolve`)."""
        return self.coordinator.resolve(key, previous, timeout)

    def wait_stop(self, key: str | None = None, timeout: float = 2.0) -> bool:
        """Long poll until the run stops."""
        return self.coordinator.wait_stop(key, timeout)

    def watch_addresses(self, watcher: Callable[[str, str], None]) -> None:
        """Tell ``watcher(key, address)`` of every address a node registers from now on, before
        a :meth:`resolve` waiting for it returns; it runs under the coordinator's lock, so it
        must not block or call the coordinator (the launcher's runtime starts a connection)."""
        self.coordinator.watchers.append(watcher)

    def __getattr__(self, method: str) -> Any:
        # Node threads (local_mt) report through this object as node processes do over RPC.
        if method.startswith("_"):
            raise AttributeError(method)
        return getattr(self.coordinator, method)


class _Watched(Coordinator):
    """A coordinator that tells its watchers of each address a node registers (no method of
    its own, so nodes cannot reach them over RPC)."""

    def __init__(self, plan: LaunchPlan, on_failure: str, stop_grace: float, failure_grace: float) -> None:
        super().__init__(plan, on_failure, stop_grace, failure_grace)
        self.watchers: list[Callable[[str, str], None]] = []

    def register(self, key: str, address: str) -> None:
        """Record that node ``key`` serves at ``address``; its watchers know before the lock goes
        (a :meth:`resolve` waiting for it needs the lock to return)."""
        with self._cond:  # reentrant
            super().register(key, address)
            for watcher in self.watchers:
                try:
                    watcher(key, address)
                except Exception:  # the registration stands, whatever a watcher does
                    log.exception("a watcher of %s's address failed", key)


def execute_node(
    node: Node,
    key: str,
    config: RuntimeConfig,
    coordinator: InProcessCoordinator,
    stop_event: threading.Event | None = None,
) -> BaseException | None:
    """Run ``node`` (as ``key``) in the calling thread, as a node process would run it.

    The node gets its own runtime (stop event, handles' clients, servers) for
    the calling thread; its start is reported, and if it raises, its traceback
    is noted with the coordinator. Reporting its end is the caller's (a
    restart loop may start it again).

    Returns:
        The exception the node raised, or None if it returned.
    """
    runtime = NodeRuntime(config, coordinator, key, stop_event)
    context.install(runtime, thread_only=True)
    debugger.install()  # for every thread: outside a node's, breakpoint() is the terminal's pdb
    coordinator.coordinator.node_started(key, threading.get_native_id(), 0)
    runtime.start_watcher()
    try:
        node.execute(runtime)
        return None
    except BaseException as exc:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        coordinator.coordinator.note_traceback(key, tb)
        if config.debug == debugger.POST_MORTEM and debugger.worth_a_post_mortem(exc, runtime.stop_event()):
            debugger.post_mortem(exc)  # held at its frames, before its end is reported
        return exc
    finally:
        runtime.close()
        context.uninstall_if(runtime)
