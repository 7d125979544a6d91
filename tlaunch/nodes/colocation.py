"""Colocations: several nodes in threads of one process, or in processes placed together."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from tlaunch import context
from tlaunch.errors import ProgramError
from tlaunch.nodes.base import Handle, Node, NodeRuntime

__all__ = ["MultiProcessingColocation", "MultiThreadingColocation"]


def _inner(kind: str, nodes: Sequence[Node]) -> list[Node]:
    nodes = list(nodes)
    if not nodes:
        raise ProgramError(f"{kind} needs at least one node, got none")
    for node in nodes:
        if not isinstance(node, Node):
            raise ProgramError(f"{kind} takes nodes, got {node!r}")
        if node.host is not None:
            raise ProgramError(
                f"inner node {node!r} has its own host {node.host}; "
                "place the colocation with .to_host() instead"
            )
    return nodes


class _Colocation(Node):
    """What both colocations share: inner nodes keyed ``label/i.j``, their handles and addresses."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        super().__init__()
        self._nodes = _inner(type(self).__name__, nodes)
        for node in self._nodes:  # bound with the colocation, like its own (Launchpad)
            self.addresses.extend(node.addresses)

    @property
    def nodes(self) -> list[Node]:
        """The colocated nodes."""
        return list(self._nodes)

    def bind(self, key: str, program: str | None = None) -> None:
        super().bind(key, program)
        for i, node in enumerate(self._nodes):
            node.bind(f"{key}.{i}", program)

    def input_handles(self) -> list[Handle]:
        return [h for node in self._nodes for h in node.input_handles()]


class MultiThreadingColocation(_Colocation):
    """Runs ``nodes`` as threads of a single process on one host.

    Handles made from the inner nodes (``node.create_handle()``) keep working,
    colocations nest, and each inner node sees its own runtime (``lp.stop()``,
    ``lp.wait_for_stop()``, ``lp.get_context()``). The colocation is done when
    every inner node is done (or, with ``return_on_first_completed``, when the
    first is), and fails as soon as one fails, with that node's error.
    """

    def __init__(self, nodes: Sequence[Node], return_on_first_completed: bool = False) -> None:
        super().__init__(nodes)
        self._first_completed = return_on_first_completed

    def execute(self, runtime: NodeRuntime) -> Any:
        errors: list[BaseException] = []
        done: list[Node] = []

        def body(node: Node) -> None:
            child = runtime.child(node.key or type(node).__name__)
            context.install(child, thread_only=True)
            try:
                node.execute(child)
            except BaseException as exc:  # raised again in the colocation's thread
                errors.append(exc)
                runtime.stop()
            finally:
                done.append(node)
                context.uninstall_if(child)

        threads = [
            threading.Thread(target=body, args=(n,), name=f"tlaunch-{n.key}", daemon=True)
            for n in self._nodes
        ]
        for t in threads:
            t.start()
        while not errors and len(done) < len(threads) and not (self._first_completed and done):
            time.sleep(0.01)
        if errors:
            raise errors[0]
        return runtime


class MultiProcessingColocation(_Colocation):
    """Runs each of ``nodes`` in a process of its own, all on the colocation's host.

    A launch places the inner nodes as nodes of their own (keys ``label/i.j``)
    on the colocation's host; each is restarted up to
    ``num_retries_on_failure`` times. Launchpad's name and arguments.
    """

    def __init__(self, nodes: Sequence[Node], num_retries_on_failure: int = 0) -> None:
        super().__init__(nodes)
        self.num_retries_on_failure = num_retries_on_failure

    def placed_nodes(self) -> list[Node]:
        for node in self._nodes:
            if self.host is not None and node.host is None:
                node._host = self.host  # they run where the colocation is placed
            node.restarts_hint = self.num_retries_on_failure
        return [n for node in self._nodes for n in node.placed_nodes()]

    def execute(self, runtime: NodeRuntime) -> Any:
        raise ProgramError(
            "a MultiProcessingColocation runs as its inner nodes, each launched on its own; "
            "launch the program that holds it"
        )
