"""Running the product as its users run it: a new ``python`` process (or the CLI) from a folder.

Every test of a user-facing flow goes through :func:`run_as_user`, never through the
test's own interpreter: there ``__main__`` is pytest, ``sys.path`` is pytest's, and what
a user's script does to ``sys.modules`` (``import torch`` adds ``__mp_main__``) is
not there. See ``tests/README.md``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent


def run_as_user(
    argv: Sequence[str],
    cwd: str | os.PathLike[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """``argv`` in a new process from ``cwd``; ``python``/``tlaunch``/... are this venv's, as activated.

    The environment is this one (``TLAUNCH_HOME`` is the test's own) plus ``env``,
    with the venv's ``bin`` first on ``PATH``; stdout and stderr are kept apart.
    """
    full = {**os.environ, **(env or {})}
    full["PATH"] = f"{BIN}{os.pathsep}{full.get('PATH', '')}"
    full.pop("PYTHONPATH", None)  # a user's shell has none of pytest's
    argv = [sys.executable, *argv[1:]] if argv[0] == "python" else [str(BIN / argv[0]), *argv[1:]]
    return subprocess.run(
        argv, cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout, input=stdin, check=False
    )


def says(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed run printed, for an assertion's message."""
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"


def own_runs(home: str | None = None) -> list[str]:
    """The ids of the runs recorded in ``$TLAUNCH_HOME`` (each test has its own)."""
    runs = Path(home or os.environ["TLAUNCH_HOME"]) / "runs"
    return sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []


def processes_of(run_id: str) -> list[str]:
    """This machine's processes (the SSH test hosts' among them) whose command line names ``run_id``,
    and this user's tmux sessions named after it: the run's alone, not any tlaunch's."""
    from tlaunch.testing import tmux_sessions

    ps = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True, check=True)
    found = [line.strip() for line in ps.stdout.splitlines()[1:] if run_id in line and "ps -ww" not in line]
    return found + [f"tmux session {s}" for s in tmux_sessions() if run_id in s]


def assert_nothing_left(hosts: Any, run_ids: Sequence[str], timeout: float = 20) -> None:
    """No process, tmux session or secret file of any of ``run_ids`` on this machine or any test host
    (``hosts``: SSH test hosts, or None)."""
    assert run_ids, "the script recorded no run"
    for run_id in run_ids:
        left = hosts.wait_no_leftovers(run_id, timeout) if hosts is not None else {}
        assert left == {}, f"run {run_id} left {left}"
        here = processes_of(run_id)
        deadline = time.monotonic() + timeout
        while here and time.monotonic() < deadline:
            time.sleep(0.25)
            here = processes_of(run_id)
        assert here == [], f"run {run_id} left on this machine: {here}"
