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
from tlaunch.launch_types import LaunchType, is_local_launch, is_local_launch_or_test
from tlaunch.rpc.security import RunKeys, process_keys

__all__ = [
    "LaunchType",
    "NodeContext",
    "NodeReference",
    "ProgramStopper",
    "Runtime",
    "current_keys",
    "current_or_none",
    "get_context",
    "is_local_launch",
    "is_local_launch_or_test",
    "make_program_stopper",
    "register_stop_handler",
    "stop",
    "stop_event",
    "unregister_stop_handler",
    "wait_for_stop",
]


@dataclass(frozen=True)
class NodeContext:
    """Who the calling code is: its node's label, index in its group, and run id.

    ``label`` and ``index`` are ``None`` in the launcher process. Launchpad's
    names are here too: ``launch_type``, ``launch_config``, ``program_stopper``.
    """

    run_id: str
    program_name: str
    label: str | None
    index: int | None
    host: str
    launch_type: str = ""
    address: str = "127.0.0.1"
    """Where other nodes of the run reach this node's host (the address its servers advertise)."""

    @property
    def launch_config(self) -> None:
        """Launchpad's per-node launch configuration (tlaunch keeps none per node)."""
        return None

    @property
    def program_stopper(self) -> Callable[[], None]:
        """A function that stops the whole program (Launchpad's name)."""
        return stop


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

    def unregister_stop_handler(self, handler: Callable[[], None]) -> None:
        """Do not call ``handler`` (registered before) at the stop."""

    def client_for(self, handle: NodeReference) -> Any:
        """Dereference ``handle`` into a client for its node."""


_local = threading.local()
_process_runtime: Runtime | None = None
_launched: dict[str, list[Runtime]] = {}  # program id -> the launcher runtimes of its runs going here
_lock = threading.Lock()


def install(runtime: Runtime | None, *, thread_only: bool = False, program_id: str | None = None) -> None:
    """Make ``runtime`` current for this thread, or (default) for the process.

    A launcher also names the program it launched (``program_id``): that
    program's handles dereferenced in this process reach this run's nodes.
    """
    global _process_runtime
    if thread_only:
        _local.runtime = runtime
        return
    with _lock:
        _process_runtime = runtime
        if runtime is not None and program_id is not None:
            _launched.setdefault(program_id, []).append(runtime)


def uninstall_if(runtime: Runtime) -> None:
    """Remove ``runtime`` wherever it is current (thread and process level, launched programs)."""
    global _process_runtime
    if getattr(_local, "runtime", None) is runtime:
        _local.runtime = None
    with _lock:
        if _process_runtime is runtime:
            _process_runtime = None
        for program_id, runtimes in list(_launched.items()):
            if runtime in runtimes:
                runtimes.remove(runtime)
                if not runtimes:
                    del _launched[program_id]


def runtime_for(program_id: str | None, what: str) -> Runtime:
    """The runtime in which a handle of program ``program_id`` is dereferenced.

    In a node (process or thread) that is the node's own runtime. In a launcher,
    the run of that very program: a handle never reaches another program's run.

    Raises:
        ProgramError: the program is not running in this process, or runs twice at once.
    """
    rt: Runtime | None = getattr(_local, "runtime", None)
    if rt is not None:
        return rt  # a node thread: its handles are its program's
    with _lock:
        process = _process_runtime
        runs = list(_launched.get(program_id, [])) if program_id is not None else []
    if process is not None and process.context.label is not None:
        return process  # a node process
    if program_id is None:
        return current(what)
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise ProgramError(
            f"{what} needs a running program, but this handle's program is not running in this "
            "process (its run has ended, or it was never launched); a handle reaches only the run "
            "of its own program: launch it again and use the handles of that program"
        )
    ids = ", ".join(r.context.run_id for r in runs)
    raise ProgramError(
        f"{what}: the program of this handle runs {len(runs)} times at once here ({ids}); a handle "
        "cannot tell which run to reach: stop all but one, or build one program per run"
    )


def current_or_none() -> Runtime | None:
    """The runtime of the calling code (its thread's, else its process's), or None."""
    rt: Runtime | None = getattr(_local, "runtime", None)
    return rt or _process_runtime


def current_keys() -> RunKeys:
    """The keys of the calling code's run; outside any run, this process's own."""
    keys = getattr(current_or_none(), "keys", None)
    return keys if isinstance(keys, RunKeys) else process_keys()


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


def wait_for_stop(timeout: float | None = None, *, timeout_secs: float | None = None) -> bool:
    """Block until the program stops or ``timeout`` (Launchpad: ``timeout_secs``) seconds pass.

    Returns:
        True if the program is stopping, False on timeout.
    """
    return current("wait_for_stop()").stop_event().wait(timeout if timeout is not None else timeout_secs)


def register_stop_handler(handler: Callable[[], None]) -> None:
    """Run ``handler`` once when the program starts stopping."""
    current("register_stop_handler()").register_stop_handler(handler)


def unregister_stop_handler(handler: Callable[[], None]) -> None:
    """Forget ``handler``, registered with :func:`register_stop_handler` (Launchpad's name)."""
    current("unregister_stop_handler()").unregister_stop_handler(handler)


class ProgramStopper:
    """A function that stops the program it is called in (Launchpad's program stopper).

    It can be passed to nodes as an argument (it pickles); called in a node, it
    stops that node's whole program, as :func:`stop` does.
    """

    def __init__(self, launch_type: LaunchType | str | None = None) -> None:
        self.launch_type = launch_type

    def __call__(self, mark_as_completed: bool = False) -> None:
        stop()

    def __repr__(self) -> str:
        return f"ProgramStopper({self.launch_type!r})"


def make_program_stopper(launch_type: LaunchType | str | None = None) -> ProgramStopper:
    """A callable that stops the running program (Launchpad's name; any launch type)."""
    return ProgramStopper(launch_type)
