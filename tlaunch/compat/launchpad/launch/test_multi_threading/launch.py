"""``launchpad.launch.test_multi_threading.launch``: a program's nodes as threads of a test."""

from __future__ import annotations

from typing import Any

from tlaunch.compat.launchpad.launch import worker_manager
from tlaunch.launcher import launch as _launch
from tlaunch.program import Program
from tlaunch.run import Run

__all__ = ["launch", "worker_manager"]


def launch(program: Program, test_case: Any = None, *, serialize_py_nodes: bool | None = None) -> Run:
    """Launch ``program`` as ``test_mt``; returns at once (``test_case``'s cleanup stops it)."""
    return _launch(program, "test_mt", test_case=test_case, serialize_py_nodes=serialize_py_nodes)
