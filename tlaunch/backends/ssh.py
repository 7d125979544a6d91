"""SSH backend: nodes on remote hosts, in tmux, over paramiko (in progress)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tlaunch.errors import LaunchError

if TYPE_CHECKING:
    from tlaunch.launcher import Run
    from tlaunch.plan import LaunchPlan
    from tlaunch.program import Program

__all__ = ["launch_ssh"]


def launch_ssh(program: Program, plan: LaunchPlan, **options: Any) -> Run:
    """Launch ``plan`` on its hosts over SSH."""
    raise LaunchError(
        f"program {program.name!r} places nodes on remote hosts, and this build of "
        "tlaunch cannot launch over SSH yet; run it locally without .to_host()"
    )
