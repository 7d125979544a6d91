"""Nodes run by hand, outside any launch: the runtime of Launchpad's tests.

Launchpad's own tests call ``node.run()`` in a thread, bind addresses with a
test helper and dereference handles straight to those addresses, or make a
``WorkerManager`` to get ``wait_for_stop()`` in the calling thread. Here there
is no coordinator: a node serves at its bound address (or any free port), a
handle reaches its node's bound address, and keys are this process's own
(:func:`~tlaunch.rpc.security.process_keys`): nothing outside the process can
talk to these servers.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from tlaunch import context
from tlaunch.context import NodeContext, NodeReference
from tlaunch.errors import ProgramError
from tlaunch.rpc.client import direct_client
from tlaunch.rpc.security import process_keys
from tlaunch.rpc.server import RPCServer, StopServing

__all__ = ["StandaloneRuntime", "WorkerManager", "worker_manager"]

log = logging.getLogger(__name__)


class StandaloneRuntime:
    """What a node run by hand needs of its process (see the module docstring)."""

    def __init__(self, name: str = "standalone", stop_event: threading.Event | None = None) -> None:
        self.context = NodeContext("standalone", name, None, None, "localhost")
        self.keys = process_keys()
        self._stop = stop_event or threading.Event()
        self._handlers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._servers: list[RPCServer] = []

    # -- tlaunch.context.Runtime ---------------------------------------
    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            handlers, self._handlers = self._handlers, []
        for handler in handlers:
            try:
                handler()
            except Exception:
                log.exception("stop handler %r raised", handler)

    def stop_event(self) -> threading.Event:
        return self._stop

    def wait_for_stop(self, timeout_secs: float | None = None) -> bool:
        """Block until stopped or ``timeout_secs`` pass; True if stopped (Launchpad's method)."""
        return self._stop.wait(timeout_secs)

    def register_stop_handler(self, handler: Callable[[], None]) -> None:
        with self._lock:
            self._handlers.append(handler)
        if self._stop.is_set():
            self.stop()

    def unregister_stop_handler(self, handler: Callable[[], None]) -> None:
        with self._lock:
            if handler in self._handlers:
                self._handlers.remove(handler)

    def client_for(self, handle: NodeReference) -> Any:
        address = getattr(handle, "direct_address", lambda: None)()
        if address is None:
            raise ProgramError(
                f"{handle!r} has no bound address: outside a launch, bind its node's addresses "
                "first (address_builder.bind_addresses([node]))"
            )
        return direct_client(repr(handle), address, self.keys)

    # -- tlaunch.nodes.base.NodeRuntime --------------------------------
    def set_state(self, state: str) -> None:
        """Nobody keeps states outside a launch."""

    def serve(self, obj: object, port: int = 0) -> StopServing:
        server = RPCServer(obj, self.keys, "127.0.0.1", port=port)
        self._servers.append(server)
        return server.close

    def child(self, key: str) -> StandaloneRuntime:
        child = StandaloneRuntime(key, self._stop)
        child._handlers = self._handlers  # one stop, one set of handlers
        child._lock = self._lock
        return child

    def close(self) -> None:
        """Stop every server it started."""
        for server in self._servers:
            server.close()
        self._servers.clear()


_Worker = collections.namedtuple("_Worker", ["thread", "future"])


class WorkerManager(StandaloneRuntime):
    """Threads of nodes run by hand, with one stop between them (Launchpad's ``WorkerManager``).

    Args:
        kill_main_thread: accepted for Launchpad's signature; threads are never killed here.
        register_in_thread: make it the calling thread's runtime (``lp.wait_for_stop()``,
            ``lp.stop()``... work in it).
    """

    def __init__(self, kill_main_thread: bool = True, register_in_thread: bool = False) -> None:
        super().__init__("workers")
        self._active_workers: dict[str, list[_Worker]] = collections.defaultdict(list)
        self._workers_count: dict[str, int] = collections.defaultdict(int)
        self._first_failure: BaseException | None = None
        self._mutex = threading.Lock()
        if register_in_thread:
            context.install(self, thread_only=True)

    def thread_worker(self, name: str, function: Callable[[], Any]) -> None:
        """Run ``function`` in a thread of group ``name``; it sees this manager as its runtime."""
        future: Future[Any] = Future()

        def body() -> None:
            context.install(self, thread_only=True)
            try:
                future.set_result(function())
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                context.uninstall_if(self)

        thread = threading.Thread(target=body, name=name, daemon=True)
        with self._mutex:
            self._workers_count[name] += 1
            self._active_workers[name].append(_Worker(thread, future))
        thread.start()

    def _check(self) -> None:
        with self._mutex:
            for label, workers in self._active_workers.items():
                alive = []
                for worker in workers:
                    if worker.thread.is_alive():
                        alive.append(worker)
                        continue
                    error = worker.future.exception()
                    if error is not None and self._first_failure is None and not self._stop.is_set():
                        self._first_failure = error
                self._active_workers[label] = alive

    def wait(
        self,
        labels_to_wait_for: Sequence[str] | None = None,
        raise_error: bool = True,
        return_on_first_completed: bool = False,
    ) -> None:
        """Wait for the workers of ``labels_to_wait_for`` (all by default) to end.

        Raises:
            BaseException: the first worker's own error, if one failed (``raise_error``).
        """
        while True:
            self._check()
            with self._mutex:
                if self._first_failure is not None and raise_error:
                    failure, self._first_failure = self._first_failure, None
                    self.stop()
                    raise failure
                labels = list(labels_to_wait_for or self._active_workers)
                busy = any(self._active_workers[label] for label in labels)
                done_one = any(
                    len(self._active_workers[label]) < self._workers_count[label] for label in labels
                )
            if not busy or (return_on_first_completed and done_one):
                return
            time.sleep(0.02)

    def _sigterm(self) -> None:
        """Stop the workers (Launchpad's name)."""
        self.stop()

    def stop_and_wait(self) -> None:
        """Stop every worker and wait for them."""
        self.stop()
        self.wait(raise_error=False)

    def cleanup_after_test(self, test_case: object = None) -> None:
        """Stop and wait (a test's cleanup); raise the first worker's error, if any."""
        self._check()
        self.stop()
        self.wait(raise_error=False)
        context.uninstall_if(self)
        self.close()
        if self._first_failure is not None:
            raise self._first_failure


def worker_manager() -> WorkerManager:
    """The calling thread's :class:`WorkerManager`.

    Raises:
        RuntimeError: the thread has none (Launchpad's message).
    """
    runtime = context.current_or_none()
    if not isinstance(runtime, WorkerManager):
        raise RuntimeError("Worker manager is only available from the Launchpad's program node thread.")
    return runtime
