"""SSH transport: one paramiko connection per host, reused for everything."""

from tlaunch.ssh.config import SSHTarget, config_path, resolve_target
from tlaunch.ssh.connection import Connection, Result
from tlaunch.ssh.fanout import connect_all, pmap, raise_for_hosts
from tlaunch.ssh.held import Held, let_go_all, run_held

__all__ = [
    "Connection",
    "Held",
    "Result",
    "SSHTarget",
    "config_path",
    "connect_all",
    "let_go_all",
    "pmap",
    "raise_for_hosts",
    "resolve_target",
    "run_held",
]
