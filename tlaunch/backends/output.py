"""Node output in the launcher's terminal: one coloured ``[prefix]`` per node."""

from __future__ import annotations

import threading

from rich.console import Console
from rich.text import Text

__all__ = ["Printer"]

_COLORS = ["cyan", "green", "yellow", "magenta", "blue", "bright_red", "bright_cyan", "bright_green"]


class Printer:
    """Prints lines of many nodes, each with its own prefix and colour; thread-safe."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False, soft_wrap=True)
        self._colors: dict[str, str] = {}
        self._lock = threading.Lock()

    def line(self, prefix: str, text: str) -> None:
        """Print ``[prefix] text``."""
        with self._lock:
            color = self._colors.setdefault(prefix, _COLORS[len(self._colors) % len(_COLORS)])
            self.console.print(Text(f"[{prefix}] ", style=color), Text(text), sep="")
