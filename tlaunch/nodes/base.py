"""Node and Handle: the vocabulary of the program graph.

A node says *what* runs (a function, an object, an RPC server); where it runs is
a host string set with :meth:`Node.to_host`, and *how* it is started is the
business of a backend, which a node never imports. In the node's process the
runtime calls :meth:`Node.execute` with a :class:`NodeRuntime`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tlaunch import context
from tlaunch.errors import ProgramError
from tlaunch.hosts import HostSpec, parse_host
from tlaunch.nodes.address import Address
from tlaunch.rpc.client import direct_client
from tlaunch.rpc.server import StopServing

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Handle", "Node", "NodeRuntime", "map_structure"]

T = TypeVar("T")


class NodeRuntime(context.Runtime, Protocol):
    """What :meth:`Node.execute` may ask of the process it runs in."""

    def set_state(self, state: str) -> None:
        """Report the node's state (``running``: it has a run phase; ``serving``)."""

    def serve(self, obj: object, port: int = 0) -> StopServing:
        """Serve ``obj``'s public methods over RPC (on ``port``, or any); returns a function that stops it."""

    def child(self, key: str) -> NodeRuntime:
        """The runtime of a node colocated in this process under ``key``."""


class Handle:
    """A reference to a node, usable in other nodes' constructor arguments.

    In the node process a handle found anywhere in the arguments (nested in
    lists, tuples, dicts) is replaced by its client; ``dereference()`` does the
    same by hand.
    """

    __slots__ = ("_key", "_node", "_program", "_wrap")

    def __init__(
        self,
        node: Node | None = None,
        key: str | None = None,
        wrap: Callable[[Any], Any] | None = None,
        program: str | None = None,
    ) -> None:
        self._node = node
        self._key = key
        self._wrap = wrap  # turns the RPC client into the node type's client (TransmitNode)
        self._program = program

    @property
    def key(self) -> str:
        """The ``label/index`` of the node this handle refers to."""
        key = self._key if self._key is not None else (self._node and self._node.key)
        if not key:
            raise ProgramError(
                "this handle's node was never added to a program; pass the node to "
                "program.add_node() before using its handle"
            )
        return key

    @property
    def program_id(self) -> str | None:
        """The id of the program whose node this handle refers to."""
        if self._program is not None or self._node is None:
            return self._program
        return self._node.program_id

    def direct_address(self) -> str | None:
        """The address its node was bound to before running (Launchpad's addressing), if any."""
        return None if self._node is None else self._node.direct_address()

    def dereference(self) -> Any:
        """The client of the node: method calls on it run remotely.

        In the launcher, a handle reaches the node of its own program's run,
        never another run's. A node bound to an address before it runs
        (Launchpad's tests) is reached there directly.

        Raises:
            ProgramError: the handle's program is not running in this process.
        """
        address = self.direct_address()
        if address is not None:
            client = direct_client(repr(self), address, context.current_keys())
            return client if self._wrap is None else self._wrap(client)
        return self.client(context.runtime_for(self.program_id, "Handle.dereference()"))

    def client(self, runtime: context.Runtime) -> Any:
        """The client of the node in ``runtime``."""
        rpc = runtime.client_for(self)
        return rpc if self._wrap is None else self._wrap(rpc)

    def __reduce__(self) -> tuple[object, ...]:
        return (Handle, (None, self.key, self._wrap, self.program_id))

    def __repr__(self) -> str:
        key = self._key or (self._node.key if self._node else None)
        return f"Handle({key or 'unbound'})"


class Node(abc.ABC):
    """Base of every node type."""

    def __init__(self) -> None:
        self._host: HostSpec | None = None
        self._key: str | None = None
        self._program: str | None = None
        self._also_added: list[str] = []
        self.addresses: list[Address] = []  # Launchpad's addressing: bound before the node runs

    def to_host(self, host: str) -> Self:
        """Place this node on ``host`` (``host``, ``host:port``, ``user@host:port``
        or an ssh-config alias); returns the node, so calls chain.

        Raises:
            ProgramError: ``host`` is not a valid host string.
        """
        self._host = parse_host(host)
        return self

    @property
    def host(self) -> HostSpec | None:
        """Where this node runs; ``None`` means the launcher's machine."""
        return self._host

    @property
    def key(self) -> str | None:
        """``label/index`` once the node is added to a program."""
        return self._key

    @property
    def program_id(self) -> str | None:
        """The id of the program the node was added to."""
        return self._program

    def bind(self, key: str, program: str | None = None) -> None:
        """Called by :meth:`Program.add_node`; fixes the node's identity (its key in its program).

        A node added again keeps its first key; the others are noted, and a
        launch of its program is refused (see :meth:`check_added_once`).
        """
        if self._key is not None:
            self._also_added.append(key)
            return
        self._key = key
        self._program = program

    def check_added_once(self) -> None:
        """Raise if this node object was added to its program more than once.

        Raises:
            ProgramError: naming every key it was added under.
        """
        if self._also_added:
            keys = ", ".join(repr(k) for k in [self._key, *self._also_added])
            raise ProgramError(
                f"node {type(self).__name__} was added {1 + len(self._also_added)} times (as {keys}); "
                "one node runs once: create a new node object for each add_node() call"
            )

    def create_handle(self) -> Handle:
        """A handle to this node (bound to its key once the node is added)."""
        return Handle(self)

    def input_handles(self) -> list[Handle]:
        """The handles this node's arguments refer to."""
        return []

    @property
    def has_handle(self) -> bool:
        """Whether the handle of this node can be dereferenced into a client."""
        return False

    def placed_nodes(self) -> list[Node]:
        """The nodes a launch places for this one: itself (a multi-processing colocation: its inner nodes)."""
        return [self]

    restarts_hint = 0
    """Restarts this node asks for beyond the launch's ``max_restarts`` (a colocation's retries)."""

    def allocate_address(self, address: Address) -> None:
        """Make ``address`` one this node listens at (Launchpad's addressing, see :mod:`.address`)."""
        address.assign(self)

    def direct_address(self) -> str | None:
        """Where this node serves when its address was bound before it runs; None otherwise."""
        return None

    @abc.abstractmethod
    def execute(self, runtime: NodeRuntime) -> Any:
        """Run the node in its own process (or thread); returns when it is done."""

    def run(self) -> Any:
        """Run the node here, in the calling thread (Launchpad's tests run nodes by hand).

        It runs under the thread's runtime (a ``WorkerManager``'s, or a launched
        node's); with none, as a node of no program: servers listen at the
        node's bound address, handles reach bound addresses.
        """
        from tlaunch.nodes.standalone import StandaloneRuntime

        return self.execute(context.current_or_none() or StandaloneRuntime(type(self).__name__))  # type: ignore[arg-type]


def map_structure(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every leaf of nested lists, tuples (named too), dicts and sets."""
    if isinstance(obj, (list, set, frozenset)):
        return type(obj)(map_structure(fn, x) for x in obj)
    if isinstance(obj, tuple):
        items = [map_structure(fn, x) for x in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if isinstance(obj, dict):
        out = {k: map_structure(fn, v) for k, v in obj.items()}
        if type(obj) is dict:
            return out
        try:
            return type(obj)(out)
        except TypeError:  # e.g. defaultdict: its first argument is a factory
            return out
    return fn(obj)


def find_handles(obj: Any) -> list[Handle]:
    """Every :class:`Handle` nested in ``obj``."""
    found: list[Handle] = []

    def visit(x: Any) -> Any:
        if isinstance(x, Handle):
            found.append(x)
        return x

    map_structure(visit, obj)
    return found


def dereference_all(obj: Any, runtime: context.Runtime) -> Any:
    """Replace every handle nested in ``obj`` with its client."""
    return map_structure(lambda x: x.client(runtime) if isinstance(x, Handle) else x, obj)
