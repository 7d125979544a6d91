"""``launchpad.launch.test_multi_processing.launch``: a process per node, for a test."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tlaunch.launcher import launch as _launch
from tlaunch.program import Program
from tlaunch.run import Run

__all__ = ["launch"]


def launch(program: Program, test_case: Any = None, local_resources: Mapping[str, Any] | None = None) -> Run:
    """Launch ``program`` as ``test_mp``; returns at once (``test_case``'s cleanup stops it)."""
    return _launch(program, "test_mp", local_resources=local_resources, test_case=test_case)
