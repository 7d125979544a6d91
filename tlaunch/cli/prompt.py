"""The prompts of the CLI's interactive commands (light: ``tlaunch job ...`` imports it)."""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["pick_one"]


def pick_one(count: int, console: Console, hint: str) -> int | None:
    """Which of the ``count`` paused nodes just listed to attach to (0-based), asked at a prompt.

    None when the user picks none, or where there is no terminal to ask at
    (``hint`` then says how to name one).
    """
    if not sys.stdin.isatty():
        console.print(hint)
        return None
    while True:
        try:
            answer = input(f"attach to which (1-{count}, empty: none)? ").strip()
        except EOFError:
            return None
        if not answer:
            return None
        if answer.isdigit() and 1 <= int(answer) <= count:
            return int(answer) - 1
