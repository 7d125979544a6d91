"""The runtime a node (or the launcher) runs under: stop, handles, serving.

It talks to the run's coordinator either directly (same process: thread
launches) or through an RPC client (node processes); both expose the same
methods, so this module does not care which.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from tlaunch.context import NodeContext, NodeReference
from tlaunch.errors import ResolveTimeoutError, RPCError, RunFailedError
from tlaunch.rpc.client import RPCClient
from tlaunch.rpc.security import RunKeys
from tlaunch.rpc.server import RPCServer, StopServing
from tlaunch.runtime.states import COMPLETED, REQUESTED

__all__ = ["AHEAD_UNASKED", "NodeRuntime", "RuntimeConfig"]

log = logging.getLogger(__name__)

AHEAD_UNASKED = 16
"""Nodes a launcher that calls its nodes connects to as they register, before it asks for them."""


class RuntimeConfig(NamedTuple):
    """Settings every node of a run shares."""

    run_id: str
    program_name: str
    keys: RunKeys
    bind_host: str = "127.0.0.1"
    advertise_host: str = "127.0.0.1"
    host_name: str = "localhost"
    resolve_timeout: float = 300.0
    coordinator_lost_after: float = 15.0
    stop_grace: float = 5.0
    launch_type: str = ""
    flags: dict[str, tuple[str, Any]] | None = None  # the launcher's parsed absl flags
    setups: tuple[Callable[[], None], ...] = ()  # run before the node is unpickled (runtime/setups.py)
    # The scheduler whose job the node runs in ("slurm"): a SIGTERM that is not the
    # run's own stop is the scheduler ending the job (scancel, time limit), a stop.
    scheduler: str | None = None
    debug: str | None = (
        None  # "post-mortem": a node thread that raises waits for a debugger (runtime.debugger)
    )


class NodeRuntime:
    """Implements :class:`tlaunch.nodes.base.NodeRuntime` for one node.

    Args:
        config: the run's settings.
        coordinator: the coordinator, or an RPC client of it.
        key: the node's ``label/index``; None for the launcher.
        stop_event: shared with a parent (colocated nodes share their process's).
    """

    def __init__(
        self,
        config: RuntimeConfig,
        coordinator: Any,
        key: str | None,
        stop_event: threading.Event | None = None,
        parent: NodeRuntime | None = None,
    ) -> None:
        self.config = config
        self.coordinator = coordinator
        self.key = key
        label, index = (None, None)
        if key is not None:
            label, _, idx = key.rpartition("/")
            index = int(idx.split(".")[0])
        self.context = NodeContext(
            config.run_id,
            config.program_name,
            label,
            index,
            config.host_name,
            config.launch_type,
            config.advertise_host,
        )
        self._stop = stop_event or threading.Event()
        self._parent = parent
        self._handlers: list[Callable[[], None]] = []
        self._handlers_lock = threading.Lock()
        self._running_handlers = threading.RLock()  # held while stop handlers run
        self._clients: dict[str, RPCClient] = {}
        self._watching = False  # the launcher's: its coordinator tells it of nodes' addresses
        self._unasked = 0  # clients made for nodes as they registered, before any call (AHEAD_UNASKED)
        self._servers: list[RPCServer] = []
        self._state_sent: str | None = None
        self._watcher: threading.Thread | None = None
        self._settled = threading.Event()  # the node has said its first state (set_state)
        self._closed = threading.Event()  # close(): the stop watcher ends, firing nothing
        self.coordinator_lost = False
        self.on_orphaned: Callable[[], None] | None = None

    @property
    def keys(self) -> RunKeys:
        """The run's keys."""
        return self.config.keys

    # -- tlaunch.context.Runtime ---------------------------------------
    def stop(self) -> None:
        who = self.key or "the launcher"
        # A node that stops the program ends it (Launchpad's way to finish); the launcher stops it.
        kind = COMPLETED if self.key else REQUESTED
        try:
            self.coordinator.stop(f"stop() was called by {who}", kind)
        except RPCError as exc:
            log.warning("could not reach the coordinator to stop the run: %s", exc)
        self._fire_stop()

    def stop_event(self) -> threading.Event:
        return self._stop

    def register_stop_handler(self, handler: Callable[[], None]) -> None:
        with self._handlers_lock:
            self._handlers.append(handler)
        if self._stop.is_set():
            self._run_handlers()

    def unregister_stop_handler(self, handler: Callable[[], None]) -> None:
        with self._handlers_lock:
            if handler in self._handlers:
                self._handlers.remove(handler)

    def client_for(self, handle: NodeReference) -> RPCClient:
        root = self._parent or self
        key = handle.key
        with root._handlers_lock:
            client = root._clients.get(key)
            if client is None:
                client = root._clients[key] = root._new_client(key)
                if not root._watching and root.key is None:
                    root._watch_addresses()
        return client

    def _new_client(self, key: str) -> RPCClient:
        return RPCClient(
            key,
            self.config.keys,
            lambda prev, timeout: self._resolve(key, prev, timeout),
            resolve_timeout=self.config.resolve_timeout,
            stop_event=self._stop,
        )

    def _watch_addresses(self) -> None:
        """The launcher's handles connect as their nodes register, where its coordinator says
        when (one in its process): a program that calls its nodes one after the other from the
        launcher finds the later ones connected meanwhile, not one handshake after another."""
        watch = getattr(type(self.coordinator), "watch_addresses", None)  # not an RPC client's stub
        if watch is not None:
            self._watching = True
            watch(self.coordinator, self._address_came)

    def _address_came(self, key: str, address: str) -> None:
        # Called with the coordinator's lock held (see watch_addresses): no coordinator call here.
        client = self._clients.get(key) or self._unasked_client(key)
        if client is not None:
            client.connect_ahead(address)

    def _unasked_client(self, key: str) -> RPCClient | None:
        """A client of node ``key``, which the launcher has not asked for, for its first
        :data:`AHEAD_UNASKED` such nodes; else None.

        A launcher that calls one of its nodes (the watch starts with its first client) is
        likely to call the others, often one after the other (``[h.dereference().f() for h
        in handles]``): each node that registers then is connected to at once, not one
        handshake after the last reply. The cap bounds what a launcher that calls one node
        of many pays: a connection (a TLS handshake, a socket; a thread on the node) each.
        """
        with self._handlers_lock:
            if key in self._clients:
                return self._clients[key]
            if self._unasked >= AHEAD_UNASKED or self._closed.is_set() or self._stop.is_set():
                return None
            self._unasked += 1
            client = self._clients[key] = self._new_client(key)
        return client

    # -- tlaunch.nodes.base.NodeRuntime --------------------------------
    def set_state(self, state: str) -> None:
        if self.key is None or self._state_sent == state:
            return
        self._state_sent = state
        self.coordinator.set_state(self.key, state)
        (self._parent or self)._settled.set()

    def serve(self, obj: object, port: int = 0) -> StopServing:
        server = RPCServer(obj, self.config.keys, self.config.bind_host, self.config.advertise_host, port)
        self._servers.append(server)
        self.coordinator.register(self.key, server.address)
        return server.close

    def child(self, key: str) -> NodeRuntime:
        return NodeRuntime(self.config, self.coordinator, key, self._stop, parent=self)

    # -- lifecycle ------------------------------------------------------
    def start_watcher(self, coordinator: Any = None, settle: float = 0.0) -> None:
        """Follow the coordinator's stop signal (a long poll that is also a heartbeat).

        Args:
            coordinator: a client of the coordinator (default: the runtime's).
            settle: the first long poll waits up to this long for the node's first state
                (:meth:`set_state`; a stop ends the wait). A long poll holds its client's
                connection: meanwhile the node's calls as it starts (``register``,
                ``set_state``) find that connection free, instead of opening another (a
                TLS handshake on both sides) on its way to serving.
        """
        link = self.coordinator if coordinator is None else coordinator
        self._watcher = threading.Thread(
            target=self._watch, args=(link, settle), name="tlaunch-stop-watch", daemon=True
        )
        self._watcher.start()

    def _watch(self, coordinator: Any, settle: float) -> None:
        if settle > 0:
            self._settled.wait(settle)
        last_ok = time.monotonic()
        while not self._stop.is_set():
            try:
                if coordinator.wait_stop(self.key, 2.0):
                    break
                last_ok = time.monotonic()
            except RPCError:
                if self._closed.is_set():  # its run was closed (a launcher's, its coordinator gone)
                    return
                if time.monotonic() - last_ok > self.config.coordinator_lost_after:
                    log.error("lost the coordinator for %.0f s: stopping", self.config.coordinator_lost_after)
                    self.coordinator_lost = True
                    break
                time.sleep(0.2)
        self._fire_stop()
        if self.coordinator_lost and self.on_orphaned is not None:
            self.on_orphaned()

    def _fire_stop(self) -> None:
        self._settled.set()  # a watcher still settling goes to its end
        if not self._stop.is_set():
            self._stop.set()
        self._run_handlers()

    def _run_handlers(self) -> None:
        """Run the stop handlers not run yet; returns once they have all run, whoever runs them.

        ``stop()`` in a node thus returns after every handler registered before it
        (the stop watcher, seeing the same stop, may be the one running them).
        """
        with self._running_handlers:
            with self._handlers_lock:
                handlers, self._handlers = self._handlers, []
            self._call_handlers(handlers)

    def _call_handlers(self, handlers: list[Callable[[], None]]) -> None:
        for h in handlers:
            try:
                h()
            except Exception:
                log.exception("stop handler %r raised", h)

    def _resolve(self, key: str, previous: str | None, timeout: float) -> str:
        # Long polls in slices, so that no coordinator call outlasts its RPC timeout.
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            answer = self.coordinator.resolve(key, previous, max(0.0, min(left, 10.0)))
            address = answer["address"]
            if address is not None or left <= 10.0 or answer["state"] in ("done", "failed", "stopped"):
                break
        if address is None:
            if timeout <= 0 and previous is not None:
                raise ResolveTimeoutError(f"{key!r} has no new address")
            rec = answer.get("record")
            if rec is not None:  # the node failed: its own error, not a timeout
                raise RunFailedError(
                    rec["key"], rec["host"], rec["exit_code"], rec["traceback"], rec["reason"] or ""
                )
            if answer["state"] in ("done", "stopped"):
                raise RPCError(f"node {key!r} has ended ({answer['state']}); it serves no more calls")
            raise ResolveTimeoutError(
                f"node {key!r} registered no address within {timeout:.0f} s "
                f"(its state: {answer['state']}); check that it started and did not fail"
            )
        return str(address)

    def close(self) -> None:
        """Close every client and server this runtime opened, and end its stop watcher once its
        coordinator answers no more; idempotent."""
        self._closed.set()
        for server in self._servers:
            server.close()
        self._servers.clear()
        with self._handlers_lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()
