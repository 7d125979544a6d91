"""SSH transport: one paramiko connection per host, reused for everything."""

from tlaunch.ssh.connection import Connection, Result, SSHTarget, connect_all, resolve_target

__all__ = ["Connection", "Result", "SSHTarget", "connect_all", "resolve_target"]
