"""``launchpad.launch.local_multi_threading.launch``: a program's nodes as threads."""

from __future__ import annotations

from tlaunch.launcher import launch as _launch
from tlaunch.program import Program
from tlaunch.run import Run

__all__ = ["launch"]


def launch(program: Program, *, serialize_py_nodes: bool | None = None) -> Run:
    """Launch ``program`` as ``local_mt``; returns at once (the interpreter's exit waits for it)."""
    return _launch(program, "local_mt", serialize_py_nodes=serialize_py_nodes)
