"""SSH backend: nodes in tmux windows on the hosts their ``to_host()`` names (see :mod:`.backend`).

Its options (:class:`SSHOptions`) import without the backend itself, which
loads paramiko: ``tlaunch.torch`` names them on every rank and agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.lazy import lazy_exports

if TYPE_CHECKING:
    from tlaunch.backends.ssh.backend import SSHBackend, attach_ssh
    from tlaunch.backends.ssh.hostside import run_dir_of
    from tlaunch.backends.tmux import session_of

__all__ = ["SSHBackend", "SSHOptions", "attach_ssh", "run_dir_of", "session_of"]

_LAZY = {
    "SSHBackend": "tlaunch.backends.ssh.backend",
    "attach_ssh": "tlaunch.backends.ssh.backend",
    "run_dir_of": "tlaunch.backends.ssh.hostside",
    "session_of": "tlaunch.backends.tmux",
}

__getattr__ = lazy_exports(__name__, _LAZY)
