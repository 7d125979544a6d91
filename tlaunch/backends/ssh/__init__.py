"""SSH backend: nodes in tmux windows on the hosts their ``to_host()`` names (see :mod:`.backend`)."""

from tlaunch.backends.ssh.backend import SSHBackend, attach_ssh
from tlaunch.backends.ssh.hostside import run_dir_of
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.backends.tmux import session_of

__all__ = ["SSHBackend", "SSHOptions", "attach_ssh", "run_dir_of", "session_of"]
