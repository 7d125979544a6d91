"""What the launcher shows on its terminal: node output with prefixes, and launch progress."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

__all__ = ["Phases", "Printer"]

log = logging.getLogger(__name__)

_COLORS = ["cyan", "green", "yellow", "magenta", "blue", "bright_red", "bright_cyan", "bright_green"]


class Printer:
    """Prints lines of many nodes, each with its own prefix and colour; thread-safe.

    Prefixes and lines are shown as plain text, never as rich markup.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False, soft_wrap=True)
        self._colors: dict[str, str] = {}
        self._lock = threading.Lock()

    def line(self, prefix: str, text: str) -> None:
        """Print ``[prefix] text``."""
        with self._lock:
            color = self._colors.setdefault(prefix, _COLORS[len(self._colors) % len(_COLORS)])
            self.console.print(Text(f"[{prefix}] ", style=color), Text(text), sep="")


class Phases:
    """A progress display of a launch's phases (connect, preflight, ship, start...), on a terminal only.

    ``times`` keeps the seconds each finished phase took (``NAME_cpu``: this
    process's CPU seconds in it, all threads); ``notes`` what the
    launch said (:meth:`note`), which every console shows (a terminal, a
    notebook, a file).
    """

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("hosts"),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,
        )
        self.times: dict[str, float] = {}
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        """Show ``text`` (``tlaunch: `` before it) above the progress bars, as plain text."""
        self.notes.append(text)
        self.console.print(Text(f"tlaunch: {text}"), soft_wrap=True)

    @contextlib.contextmanager
    def phase(self, name: str, total: int) -> Iterator[Callable[[], None]]:
        """A phase over ``total`` items (hosts); the yielded function ticks one off."""
        task = self.progress.add_task(name, total=total)
        t0, c0 = time.perf_counter(), time.process_time()
        yield lambda: self.progress.advance(task)
        self.times[name] = time.perf_counter() - t0
        self.times[f"{name}_cpu"] = time.process_time() - c0  # this process's, every thread's
        log.debug("launch phase %s: %.3f s over %d", name, self.times[name], total)
        self.progress.update(task, completed=total)

    def __enter__(self) -> Phases:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)
