"""What a failed SSH connect says: what went wrong, and how to fix it."""

from __future__ import annotations

import paramiko

from tlaunch.errors import HostKeyError, SSHError
from tlaunch.ssh.config import SSHTarget

__all__ = ["connect_error"]


def connect_error(host: str, target: SSHTarget, exc: BaseException) -> BaseException:
    """The error to raise for a failed connect: what went wrong and how to fix it."""
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyError(
            host,
            f"the host key of {target.hostname} differs from the one in known_hosts "
            f"({', '.join(target.known_hosts)}); if the host was really reinstalled, "
            f"remove the old key with `ssh-keygen -R {target.hostname}` and connect once with ssh",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        keys = ", ".join(target.key_filenames) or "the ssh-agent and ~/.ssh/id_*"
        return SSHError(host, f"authentication as {target.user!r} failed (tried {keys}): {exc}")
    if isinstance(exc, paramiko.SSHException):
        if "not found in known_hosts" in str(exc):
            return HostKeyError(
                host,
                f"{target.hostname} is not in known_hosts ({', '.join(target.known_hosts)}); "
                "check its key, then add it with `ssh-keyscan -p "
                f"{target.port} {target.hostname} >> ~/.ssh/known_hosts`, or launch with "
                "accept_unknown_hosts=True to trust it this time",
            )
        return SSHError(host, f"SSH failed: {exc}")
    if isinstance(exc, (OSError, EOFError)):
        return SSHError(
            host, f"cannot connect to {target.hostname}:{target.port}: {exc or type(exc).__name__}"
        )
    return exc
