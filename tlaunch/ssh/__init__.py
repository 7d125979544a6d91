"""SSH transport: one paramiko connection per host, reused for everything."""

from tlaunch.ssh.config import SSHTarget, config_path, resolve_target
from tlaunch.ssh.connection import Connection, Held, Result
from tlaunch.ssh.fanout import connect_all, pmap, raise_for_hosts

__all__ = [
    "Connection",
    "Held",
    "Result",
    "SSHTarget",
    "config_path",
    "connect_all",
    "pmap",
    "raise_for_hosts",
    "resolve_target",
]
