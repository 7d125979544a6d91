"""The runtime a piece of user code runs under, and the node-side API.

A node process (or a node thread under ``local_mt``) installs a runtime object;
``stop()``, ``wait_for_stop()``, handles' ``dereference()`` and friends find it
here. This module knows only the small :class:`Runtime` protocol, never a
backend or the RPC layer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tlaunch.errors import ProgramError

__all__ = [
    "NodeContext",
    "NodeReference",
    "Runtime",
    "get_context",
    "register_stop_handler",
    "stop",
    "stop_event",
    "wait_for_stop",
]


@dataclass(frozen=True)
class NodeContext:
    """Who the calling code is: its node's label, index in its group, and run id.

    ``label`` and ``index`` are ``None`` in the launcher process.
    """

    run_id: str
    program_name: str
    label: str | None
    index: int | None
    host: str


class NodeReference(Protocol):
    """What a runtime needs of a handle to make its client: the node's key."""

    @property
    def key(self) -> str:
        """The node's ``label/index``."""


class Runtime(Protocol):
    """What node-side code needs from the process it runs in."""

    context: NodeContext

    def stop(self) -> None:
        """Ask the whole program to stop."""

    def stop_event(self) -> threading.Event:
        """An event set once the program is stopping."""

    def register_stop_handler(self, handler: Callable[[], None]) -> None:
        """Call ``handler`` (once) when the program starts stopping."""

    def client_for(self, handle: NodeReference) -> Any:
        """Dereference ``handle`` into a client for its node."""


_local = threading.local()
_process_runtime: Runtime | None = None
_lock = threading.Lock()


def install(runtime: Runtime | None, *, thread_only: bool = False) -> None:
    """Make ``runtime`` current for this thread, or (default) for the process."""
    global _process_runtime
    if thread_only:
        _local.runtime = runtime
    else:
        with _lock:
            _process_runtime = runtime


def uninstall_if(runtime: Runtime) -> None:
    """Remove ``runtime`` wherever it is current (thread and process level)."""
    global _process_runtime
    if getattr(_local, "runtime", None) is runtime:
        _local.runtime = None
    with _lock:
        if _process_runtime is runtime:
            _process_runtime = None


def current(what: str = "this call") -> Runtime:
    """The runtime of the calling code.

    Raises:
        ProgramError: no program is running in this process.
    """
    rt = getattr(_local, "runtime", None) or _process_runtime
    if rt is None:
        raise ProgramError(
            f"{what} needs a running program, but none runs in this process; "
            "call it inside a node of a launched program, or while a run started "
            "with launch(..., wait=False) is active"
        )
    return rt


def get_context() -> NodeContext:
    """The :class:`NodeContext` of the calling node (label, index, run id)."""
    return current("get_context()").context


def stop() -> None:
    """Stop the whole program: every node on every host."""
    current("stop()").stop()


def stop_event() -> threading.Event:
    """An event that is set once the program starts stopping."""
    return current("stop_event()").stop_event()


def wait_for_stop(timeout: float | None = None) -> bool:
    """Block until the program stops or ``timeout`` seconds pass.

    Returns:
        True if the program is stopping, False on timeout.
    """
    return current("wait_for_stop()").stop_event().wait(timeout)


def register_stop_handler(handler: Callable[[], None]) -> None:
    """Run ``handler`` once when the program starts stopping."""
    current("register_stop_handler()").register_stop_handler(handler)
