"""tmux command lines shared by the backends that put nodes in tmux windows (local, SSH).

Commands are argv lists; the one string a window runs is built once, with
:func:`shlex.join`. tmux expands window names as formats (``#(cmd)`` would run
``cmd``), so every ``#`` of a name is doubled.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

__all__ = ["home_window", "open_windows", "session_of", "window_command", "window_name"]


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


def home_window(argv: Sequence[str], env: Mapping[str, str], direct: bool) -> str | list[str]:
    """The command of a window that runs ``argv`` with ``env`` in the home directory.

    ``direct`` (tmux 3.2 and later, started from the home directory): tmux's own
    arguments, which it runs without a shell (``-e`` for ``env``; two execs less
    a window, the shell's and ``env``'s), where ``argv`` can travel so (tmux reads
    an argument that ends with ``;`` as the end of a command); else
    :func:`window_command`'s shell line.
    """
    extra = [x for k, v in env.items() for x in ("-e", f"{k}={v}")]
    if not direct or not argv or argv[0].startswith("-") or any(a.endswith(";") for a in [*extra, *argv]):
        return window_command(argv, env=env)
    return [*extra, *argv]


def open_windows(
    session: str, windows: Sequence[tuple[str, str | Sequence[str]]], new_session: bool
) -> list[str]:
    """One tmux command line that opens every ``(name, command)`` window (and the session first).

    A command is a shell command line (:func:`window_command`) or the arguments
    :func:`home_window` made.
    """
    argv: list[str] = ["tmux"]
    for i, (name, command) in enumerate(windows):
        if i:
            argv.append(";")
        if i == 0 and new_session:
            argv += ["new-session", "-d", "-s", session, "-n", window_name(name), "-x", "200", "-y", "50"]
        else:
            argv += ["new-window", "-d", "-t", f"={session}:", "-n", window_name(name)]
        if isinstance(command, str):
            argv.append(command)
        else:
            argv += command
    return argv
