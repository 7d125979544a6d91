"""The keys an SSH connection authenticates with, each identity file read once per process.

paramiko's client reads an identity file anew for every connection, and
reading an RSA key checks it whole (``cryptography``): ~115 ms of CPU for a
3072-bit key here, per host (~0.1 ms for an Ed25519 key). :func:`identities_for`
gives ``SSHClient.connect`` the same keys in the same order, the first read once.
"""

from __future__ import annotations

import os
import threading

import paramiko

from tlaunch.ssh.config import SSHTarget

__all__ = ["identities_for"]

_identities: dict[tuple[str, int, int, int], paramiko.PKey | None] = {}
_identities_lock = threading.Lock()


def identities_for(target: SSHTarget, allow_agent: bool) -> tuple[paramiko.PKey | None, list[str], bool]:
    """What ``SSHClient.connect`` gets to authenticate with: (``pkey``, ``key_filename``,
    ``look_for_keys``), trying the same keys in the same order as paramiko would.

    The first identity file goes as a key read once per process (:func:`_identity`);
    without files named and without an agent to try first, so do the ``~/.ssh/id_*``
    keys paramiko would look for. With an agent, paramiko tries its keys before
    those files: it looks for them itself.
    """
    files = list(target.key_filenames)
    if not files:
        if allow_agent and os.environ.get("SSH_AUTH_SOCK"):
            return None, [], True
        files = _default_identities()
    first = _identity(files[0]) if files else None
    return first, files[1:] if first is not None else files, False


def _default_identities() -> list[str]:
    """The ``~/.ssh/id_*`` files paramiko's client looks for, in its order."""
    found = []
    for name in ("rsa", "ecdsa", "ed25519"):
        for folder in (".ssh", "ssh"):
            path = os.path.expanduser(f"~/{folder}/id_{name}")
            if os.path.isfile(path):
                found.append(path)
    return found


def _identity(path: str) -> paramiko.PKey | None:
    """The private key (and its ``-cert.pub``, if any) in ``path``, read once while the file is
    unchanged; None where paramiko must read it itself (a passphrase, a type it cannot tell).

    paramiko's client reads an identity file anew for every connection, and
    reading an RSA key checks it whole (``cryptography``): ~115 ms of CPU for
    a 3072-bit key here, per host; ~0.1 ms for an Ed25519 key.
    """
    full = os.path.expanduser(path)
    try:
        st = os.stat(full)
    except OSError:
        return None
    try:
        cert = os.stat(f"{full}-cert.pub").st_mtime_ns
    except OSError:
        cert = 0
    key = (path, st.st_mtime_ns, st.st_size, cert)
    with _identities_lock:
        if key not in _identities:
            try:
                _identities[key] = paramiko.PKey.from_path(path)
            except Exception:  # encrypted, unknown, unreadable: paramiko's own way, as before
                _identities[key] = None
        return _identities[key]
