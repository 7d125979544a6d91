"""Public test helpers: leftover checks now, SSH test hosts (``tlaunch.testing.hosts``)."""

from __future__ import annotations

import os
import subprocess

from tlaunch.launcher import Run
from tlaunch.procs import pid_alive

__all__ = ["assert_no_leftovers", "pid_alive", "tmux_sessions"]


def tmux_sessions() -> list[str]:
    """Names of the sessions of this user's default tmux server (empty if none runs)."""
    try:
        out = subprocess.run(
            ["tmux", "list-sessions", "-F", "#{session_name}"],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except FileNotFoundError:
        return []
    return out.stdout.split() if out.returncode == 0 else []


def assert_no_leftovers(run: Run) -> None:
    """Assert that no process and no tmux session of ``run`` remains on this machine."""
    alive = [
        f"{key} (pid {rec['pid']})"
        for key, rec in run.status().items()
        if rec["pid"] and rec["pgid"] and pid_alive(rec["pid"])
    ]
    assert not alive, f"processes of run {run.run_id} still alive: {alive}"
    sessions = [s for s in tmux_sessions() if run.run_id in s]
    assert not sessions, f"tmux sessions of run {run.run_id} still exist: {sessions}"
    assert not os.path.exists(os.path.join(run.run_dir, "bundle.pkl")), "bundle left behind"
