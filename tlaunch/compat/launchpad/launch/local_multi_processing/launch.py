"""``launchpad.launch.local_multi_processing.launch``: a process per node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tlaunch.launcher import launch as _launch
from tlaunch.program import Program
from tlaunch.run import Run

__all__ = ["launch"]


def launch(
    program: Program, local_resources: Mapping[str, Any] | None = None, terminal: str | None = None
) -> Run:
    """Launch ``program`` as ``local_mp`` and wait for it (``terminal``: where output goes)."""
    return _launch(program, "local_mp", local_resources=local_resources, terminal=terminal)
