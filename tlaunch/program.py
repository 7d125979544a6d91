"""Program: a named graph of nodes organised in labelled groups (Launchpad's model)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from tlaunch.errors import ProgramError
from tlaunch.nodes.base import Handle, Node

__all__ = ["Program", "make_program"]

_LABEL = re.compile(r"^[^\x00-\x1f/]{1,200}$")


def _check_label(label: object, what: str) -> str:
    if not isinstance(label, str) or not label or not label.strip():
        raise ProgramError(
            f"Label should not be empty: {what} {label!r} is empty; give a non-empty label such as 'worker'"
        )
    if not _LABEL.match(label):
        raise ProgramError(
            f"{what} {label!r} has a '/' or a control character (newline, tab...); "
            "use up to 200 printable characters other than '/'"
        )
    return label


class Program:
    """A distributed program: nodes in labelled groups.

    ``add_node`` returns the node's handle, which other nodes take as a
    constructor argument to talk to it::

        program = Program("demo")
        with program.group("producer"):
            producers = [program.add_node(CourierNode(Producer)) for _ in range(2)]
        program.add_node(PyNode(consume, producers), label="consumer")
    """

    def __init__(self, name: str) -> None:
        self._name = _check_label(name, "program name")
        self._id = os.urandom(8).hex()  # tells this program's handles from another's
        self._groups: dict[str, list[Node]] = {}
        self._current_group: str | None = None

    @property
    def name(self) -> str:
        """The program's name."""
        return self._name

    @property
    def program_id(self) -> str:
        """An id of this program object, unique in practice (its handles carry it)."""
        return self._id

    @property
    def groups(self) -> dict[str, list[Node]]:
        """Label to the nodes of that group, in the order they were added."""
        return {k: list(v) for k, v in self._groups.items()}

    def add_node(self, node: Node, label: str | None = None) -> Handle:
        """Add ``node`` under ``label`` (or the current group's label).

        A label used again adds to the same group, as in Launchpad.

        Returns:
            The node's handle.

        A node object added a second time (to another group, say) is listed
        there too, as in Launchpad; launching such a program is refused, since
        one node cannot run twice.

        Raises:
            ProgramError: no label outside a group, or a label that differs from
                the current group's.
        """
        if not isinstance(node, Node) and not callable(getattr(node, "create_handle", None)):
            raise ProgramError(f"add_node() takes a node (PyNode, CourierNode, ...), got {node!r}")
        if self._current_group is not None:
            if label and label != self._current_group:
                raise ProgramError(
                    f"The given label does not match the current group {self._current_group!r}: "
                    f"{label!r}; drop the label or use the group's"
                )
            label = self._current_group
        elif label is None:
            raise ProgramError(
                f"Label should not be empty: add_node({node!r}) outside a group needs a label: "
                "add_node(node, label='name') or use `with program.group('name'):`"
            )
        label = _check_label(label, "label")
        group = self._groups.setdefault(label, [])
        node.bind(f"{label}/{len(group)}", self._id)
        group.append(node)
        return node.create_handle()

    @contextlib.contextmanager
    def group(self, label: str) -> Iterator[None]:
        """Nodes added inside this block join the group ``label``.

        Raises:
            ProgramError: an empty label, or a group inside a group.
        """
        label = _check_label(label, "group label")
        if self._current_group is not None:
            raise ProgramError(
                f"group() cannot be nested. group({label!r}) inside group({self._current_group!r}): "
                "close the outer group first"
            )
        self._current_group = label
        try:
            yield
        finally:
            self._current_group = None

    def get_all_nodes(self) -> list[Node]:
        """Every node of the program, group by group."""
        return [n for nodes in self._groups.values() for n in nodes]

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self._groups.items())
        return f"Program({self._name!r}: {sizes})"


def make_program(*nodes: Node, name: str = "program") -> Program:
    """A program holding ``nodes``, each in a group named after its type."""
    program = Program(name)
    for node in nodes:
        program.add_node(node, label=type(node).__name__.lower())
    return program
