"""SSH transport: one paramiko connection per host, reused for everything."""

from tlaunch.ssh.connection import Connection, Result, SSHTarget, connect_all, resolve_target
from tlaunch.ssh.fanout import pmap, raise_for_hosts

__all__ = ["Connection", "Result", "SSHTarget", "connect_all", "pmap", "raise_for_hosts", "resolve_target"]
