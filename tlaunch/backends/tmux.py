"""tmux command lines shared by the backends that put nodes in tmux windows (local, SSH).

Commands are argv lists; the one string a window runs is built once, with
:func:`shlex.join`. tmux expands window names as formats (``#(cmd)`` would run
``cmd``), so every ``#`` of a name is doubled.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

__all__ = ["open_windows", "session_of", "window_command", "window_name"]


def session_of(run_id: str) -> str:
    """The run's tmux session name (on every host)."""
    return f"tlaunch-{run_id}"


def window_name(name: str) -> str:
    """``name`` as tmux shows it, with no format expansion (``#`` doubled)."""
    return name.replace("#", "##")


def window_command(
    argv: Sequence[str], cwd: str | None = None, env: Mapping[str, str] | None = None, log: str | None = None
) -> str:
    """The shell command of a window: ``argv`` in ``cwd`` (default ``$HOME``), its output tee'd to ``log``.

    ``env`` goes on the command line: only values that are no secret (``PYTHONPATH``).
    """
    full = shlex.join(["env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv])
    where = f"cd {shlex.quote(cwd)}" if cwd else 'cd "$HOME"'
    if log is None:
        return f"{where} && exec {full}"
    return f"{where} && {full} 2>&1 | tee -a {shlex.quote(log)}"


def open_windows(session: str, windows: Sequence[tuple[str, str]], new_session: bool) -> list[str]:
    """One tmux command line that opens every ``(name, command)`` window (and the session first)."""
    argv: list[str] = ["tmux"]
    for i, (name, command) in enumerate(windows):
        if i:
            argv.append(";")
        if i == 0 and new_session:
            argv += ["new-session", "-d", "-s", session, "-n", window_name(name), "-x", "200", "-y", "50"]
        else:
            argv += ["new-window", "-d", "-t", f"={session}:", "-n", window_name(name)]
        argv.append(command)
    return argv
