"""MultiThreadingColocation: several nodes in threads of one process."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tlaunch.errors import ProgramError
from tlaunch.nodes.base import Handle, Node, NodeRuntime

__all__ = ["MultiThreadingColocation"]


class MultiThreadingColocation(Node):
    """Runs ``nodes`` as threads of a single process on one host.

    Handles made from the inner nodes (``node.create_handle()``) keep working;
    the colocation is done when every inner node is done, and fails when one fails.
    """

    def __init__(self, nodes: Sequence[Node]) -> None:
        super().__init__()
        nodes = list(nodes)
        if not nodes:
            raise ProgramError("MultiThreadingColocation needs at least one node, got none")
        for node in nodes:
            if not isinstance(node, Node):
                raise ProgramError(f"MultiThreadingColocation takes nodes, got {node!r}")
            if isinstance(node, MultiThreadingColocation):
                raise ProgramError("MultiThreadingColocation cannot contain another colocation")
            if node.host is not None:
                raise ProgramError(
                    f"inner node {node!r} has its own host {node.host}; place the "
                    "colocation with .to_host() instead"
                )
        self._nodes = nodes

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

    def execute(self, runtime: NodeRuntime) -> None:
        errors: list[BaseException] = []

        def body(node: Node) -> None:
            child = runtime.child(node.key or "")
            try:
                node.execute(child)
            except BaseException as exc:  # re-raised in the colocation's thread
                errors.append(exc)
                runtime.stop()

        threads = [
            threading.Thread(target=body, args=(n,), name=f"tlaunch-{n.key}", daemon=True)
            for n in self._nodes
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
