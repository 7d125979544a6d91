"""DeepSpeed's CPU op for the tests: built once a machine, where every test host sees it, never waited on.

DeepSpeed builds its CPU communication op (``deepspeed_shm_comm``) with
torch's ``cpp_extension`` under ``$TORCH_EXTENSIONS_DIR``. Every rank of every
DeepSpeed run takes that op's ``lock`` file there (torch's ``FileBaton``: made
with ``O_EXCL``, its descriptor held while the rank builds or checks the op,
then removed), and a rank that finds it waits until it is gone, with no
timeout and no check that its maker lives. A run killed meanwhile (a test's
timeout, Ctrl-C, a stop at the wrong moment) leaves the file, and every later
DeepSpeed run waited until its own timeout.

:func:`deepspeed_env` is the environment of the tests' DeepSpeed runs: the op
in :data:`EXTENSIONS` (``/var/tmp``, which every SSH test host and SLURM node
of this machine sees, kept between sessions: CI builds it once a machine),
after removing the ``lock`` files nobody holds: no process has one open, twice,
a second apart (a rank releasing its lock closes it just before it removes it).
"""

from __future__ import annotations

import contextlib
import os
import time

__all__ = ["EXTENSIONS", "clear_stale_locks", "deepspeed_env", "holders"]

EXTENSIONS = "/var/tmp/tlaunch-test-torch-extensions"


def holders(path: str) -> list[int]:
    """The processes of this machine that have ``path`` open (their ``/proc/<pid>/fd``)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                        found.append(int(pid))
                        break
    return found


def clear_stale_locks(folder: str = EXTENSIONS, settle: float = 1.0) -> list[str]:
    """Remove the op ``lock`` files under ``folder`` that no process holds; those removed."""
    locks = []
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            path = os.path.join(folder, name, "lock")
            with contextlib.suppress(OSError):
                locks.append((path, os.stat(path).st_ino))
    unheld = [(p, ino) for p, ino in locks if not holders(p)]
    if not unheld:
        return []
    time.sleep(settle)  # the same file, still held by nobody: its maker is gone
    removed = []
    for path, ino in unheld:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == ino and not holders(path):
                os.unlink(path)
                removed.append(path)
    return removed


def deepspeed_env() -> dict[str, str]:
    """The environment of a test's DeepSpeed run (see the module docstring)."""
    os.makedirs(EXTENSIONS, exist_ok=True)
    clear_stale_locks()
    return {"DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": EXTENSIONS}
