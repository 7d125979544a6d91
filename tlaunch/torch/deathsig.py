"""``python -m tlaunch.torch.deathsig SIGNAL PARENT_PID PROGRAM [ARGS...]``: exec PROGRAM bound to its parent.

Sets ``PR_SET_PDEATHSIG`` (Linux), which survives ``execv``, so PROGRAM gets
SIGNAL the moment the thread that started it dies, even by SIGKILL; exits at
once if that parent is already gone. An agent's workers and per-host
launchers start through it: they are in sessions of their own (killed whole
by the agent), which a kill of the agent's process group does not reach.
"""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


def main(argv: list[str]) -> None:
    """Arm the death signal and exec the program (never returns)."""
    sig, parent, program = int(argv[0]), int(argv[1]), argv[2:]
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    os.execv(program[0], program)


if __name__ == "__main__":
    main(sys.argv[1:])
