"""The launch plan: which node runs where, resolved from a program (pure).

Backends consume a :class:`LaunchPlan`; nothing in here starts anything.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tlaunch.errors import ProgramError
from tlaunch.hosts import HostSpec

if TYPE_CHECKING:  # the head unpickles plans: it loads neither nodes nor programs (~4 ms of its start)
    from tlaunch.nodes.base import Node
    from tlaunch.program import Program

__all__ = ["LaunchPlan", "NodeSpec", "log_name", "make_plan", "new_run_id", "placed_nodes"]


@dataclass(frozen=True)
class NodeSpec:
    """One node of the plan."""

    key: str
    label: str
    index: int
    kind: str
    host: HostSpec | None
    has_handle: bool
    restarts_hint: int = 0
    handles: tuple[str, ...] = ()
    """The keys of the nodes whose handles it takes (the program's graph: who calls whom)."""


@dataclass(frozen=True)
class LaunchPlan:
    """A program resolved for one run."""

    run_id: str
    program_name: str
    nodes: tuple[NodeSpec, ...]
    program_id: str | None = None

    @property
    def hosts(self) -> tuple[HostSpec | None, ...]:
        """The distinct hosts of the plan, in order of first use (None: local)."""
        seen: dict[HostSpec | None, None] = {}
        for n in self.nodes:
            seen.setdefault(n.host, None)
        return tuple(seen)

    def graph(self) -> list[dict[str, object]]:
        """Every node with its group, kind, host and the nodes whose handles it takes (JSON-ready)."""
        return [
            {
                "key": n.key,
                "label": n.label,
                "kind": n.kind,
                "host": None if n.host is None else str(n.host),
                "handles": list(n.handles),
            }
            for n in self.nodes
        ]

    def node(self, key: str) -> NodeSpec:
        """The node with ``key``."""
        for n in self.nodes:
            if n.key == key:
                return n
        raise KeyError(key)


def new_run_id(program_name: str) -> str:
    """A unique, filesystem- and tmux-safe run id derived from the program name."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in program_name)[:40]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{safe or 'program'}-{stamp}-{os.urandom(3).hex()}"


def make_plan(program: Program, run_id: str | None = None) -> LaunchPlan:
    """Resolve ``program`` into a plan and check its handles.

    Raises:
        ProgramError: the program has no nodes, or a node's arguments hold a
            handle of a node outside the program or of a node without a client.
    """
    nodes = placed_nodes(program)
    by_key: dict[str, Node] = {}

    def index(node: Node) -> None:
        by_key[node.key or ""] = node
        for inner in getattr(node, "nodes", []):
            index(inner)

    for node in nodes:
        index(node)
    for node in nodes:
        for handle in node.input_handles():
            key = handle.key
            target = by_key.get(key)
            if target is None:
                raise ProgramError(
                    f"node {node.key!r} takes a handle of {key!r}, which is not in "
                    f"program {program.name!r}; add that node to this program"
                )
            if not target.has_handle:
                raise ProgramError(
                    f"node {node.key!r} takes the handle of {key!r}, a "
                    f"{type(target).__name__}, which serves nothing; only CourierNode "
                    "(and TransmitNode) handles can be passed to other nodes"
                )
    specs = []
    for node in nodes:
        key = node.key or ""
        label, _, position = key.rpartition("/")
        specs.append(
            NodeSpec(
                key=key,
                label=label,
                index=int(position.split(".")[0]),
                kind=type(node).__name__,
                host=node.host,
                has_handle=node.has_handle,
                restarts_hint=node.restarts_hint,
                handles=tuple(dict.fromkeys(h.key for h in node.input_handles())),
            )
        )
    return LaunchPlan(
        run_id=run_id or new_run_id(program.name),
        program_name=program.name,
        nodes=tuple(specs),
        program_id=program.program_id,
    )


def placed_nodes(program: Program) -> list[Node]:
    """The nodes a launch of ``program`` places, each once, in program order.

    Raises:
        ProgramError: no nodes, something that is no node, or a node added twice.
    """
    from tlaunch.nodes.base import Node

    nodes = program.get_all_nodes()
    if not nodes:
        raise ProgramError(f"program {program.name!r} has no nodes; add some with program.add_node()")
    for node in nodes:
        if not isinstance(node, Node):
            raise ProgramError(f"program {program.name!r} holds {node!r}, which is not a tlaunch node")
        node.check_added_once()
    return [placed for node in nodes for placed in node.placed_nodes()]


def log_name(key: str) -> str:
    """The log file name of node ``key`` (``label/i`` -> ``label_i.log``)."""
    label, _, index = key.rpartition("/")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    return f"{safe}_{index}.log"
