"""Launchpad's ``launch()`` arguments and their semantics, turned into tlaunch's.

``launch(programs, launch_type, xm_resources, local_resources, test_case,
terminal, serialize_py_nodes=...)`` behaves as in Launchpad whenever its names
are used: a list of programs launches the first; ``--lp_launch_type`` and
``--lp_terminal`` are read when no argument says otherwise; thread and test
launches return at once (``local_mt`` then waits for its program when the
interpreter exits; a ``test_case`` stops the run in its cleanup); test_mt
checks that nodes pickle unless ``serialize_py_nodes=False``. tlaunch's own
options (``wait=True``...) stay available and win when given.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tlaunch.errors import LaunchError, PicklingError
from tlaunch.flags import LAUNCH_TYPE, TERMINAL, chosen
from tlaunch.nodes.address import SimpleLocalAddressBuilder
from tlaunch.nodes.base import Node
from tlaunch.program import Program
from tlaunch.runtime.packing import pickle_node

__all__ = [
    "LaunchpadArgs",
    "bind_addresses",
    "check_nodes_serializable",
    "check_serializable",
    "finish_later",
    "read_args",
]

log = logging.getLogger(__name__)

# Python 3.12+ starts no thread once the interpreter shuts down, and a local_mt
# program waited for at exit needs new ones (RPC connections, futures): there,
# local_mt waits in launch() instead.
_RETURN_AT_ONCE: tuple[str, ...] = ("test_mt", "test_mp")
if sys.version_info < (3, 12):
    _RETURN_AT_ONCE = ("local_mt", *_RETURN_AT_ONCE)


@dataclass(frozen=True)
class LaunchpadArgs:
    """What Launchpad's arguments mean for this launch."""

    program: Program
    launch_type: Any
    terminal: str | None
    wait: bool
    test_case: Any
    serialize: bool
    workers_exited_error: bool = False
    """A node's failure is (also) a ``RuntimeError`` saying "One of the workers exited." (test_mp)."""


def read_args(
    programs: Program | Sequence[Program],
    launch_type: Any,
    terminal: str | None,
    wait: bool | None,
    test_case: Any,
    serialize_py_nodes: bool | None,
    xm_resources: Any,
) -> LaunchpadArgs:
    """Launchpad's arguments, resolved (see the module docstring).

    Raises:
        LaunchError: no program at all.
    """
    if isinstance(programs, Program):
        program = programs
    else:
        listed = list(programs)
        if not listed or not all(isinstance(p, Program) for p in listed):
            raise LaunchError(f"launch() takes a Program or a list of them, got {programs!r}")
        if len(listed) > 1:
            log.warning("%d programs were given: launching only the first, as Launchpad does", len(listed))
        program = listed[0]
    if xm_resources is not None:
        log.info("xm_resources apply to Vertex AI launches (XManager); a tlaunch launch ignores them")
    launch_type = launch_type if launch_type is not None else chosen(LAUNCH_TYPE)
    terminal = terminal if terminal is not None else chosen(TERMINAL)
    name = str(getattr(launch_type, "value", launch_type))
    if wait is None:
        wait = name not in _RETURN_AT_ONCE
    serialize = serialize_py_nodes if serialize_py_nodes is not None else name == "test_mt"
    return LaunchpadArgs(program, launch_type, terminal, wait, test_case, serialize, name == "test_mp")


def check_serializable(program: Program) -> None:
    """Launchpad's serialization check of thread launches: every node must pickle.

    Raises:
        PicklingError: naming the label whose nodes cannot be pickled (also a RuntimeError).
    """
    for label, nodes in program.groups.items():
        check_nodes_serializable(f"the label {label!r}", nodes)


def check_nodes_serializable(description: str, nodes: Sequence[Node]) -> None:
    """Raise if a node of ``nodes`` (``description``: whose they are) cannot be pickled.

    Raises:
        PicklingError: "The nodes associated to {description} ..." (also a RuntimeError).
    """
    for node in nodes:
        try:
            pickle_node(node)
        except PicklingError as exc:
            raise PicklingError(
                f"The nodes associated to {description} cannot be pickled (thread launches "
                f"check it, as a process launch would need it): {exc}; launch with "
                "serialize_py_nodes=False to run them unpickled"
            ) from exc


def bind_addresses(nodes: Sequence[Node]) -> None:
    """Bind the addresses nodes allocated (Launchpad's addressing) to free ports of this machine.

    A ``CourierNode``'s own address is left alone: its server takes any free port
    and the run's coordinator tells its handles.
    """

    def visit(node: Node) -> None:
        own = getattr(node, "courier_address", None)
        for address in node.addresses:
            if not address.bound and address is not own:
                address.bind(SimpleLocalAddressBuilder())
        for inner in getattr(node, "nodes", []):
            visit(inner)

    for node in nodes:
        visit(node)


def finish_later(
    args: LaunchpadArgs, wait: Callable[[], Any], stop: Callable[[], Any], cleanup: Callable[[Any], Any]
) -> None:
    """What happens to a run that ``launch`` returned at once (Launchpad's thread and test launches).

    With a ``test_case``, its cleanup stops the run (and fails the test with a
    node's failure that no ``wait()`` raised); else a ``local_mt`` run is
    waited for when the interpreter exits, and a test run is stopped then.
    """
    if args.test_case is not None:
        args.test_case.addCleanup(cleanup, args.test_case)
        return
    name = str(getattr(args.launch_type, "value", args.launch_type))
    finish = wait if name == "local_mt" else stop

    def then() -> None:
        try:
            finish()
        except BaseException as exc:  # the interpreter is exiting: say it, as Launchpad does
            sys.stderr.write(f"tlaunch: {exc}\n")

    # Before the interpreter shuts its thread pools down (the nodes' futures need them).
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(then)
    else:  # pragma: no cover - Python without the hook
        atexit.register(then)
