"""A runtime environment from a job server's sealed store (``tlaunch server --unix-users``, this machine).

Under ``--unix-users`` a job's launcher runs as its user's account, so an
environment it built itself would be that account's: any job of the user could
give it its write bits back and change what the user's later jobs import. So on
the server's own machine the environments of a user live in a store that root
owns (``<home>/users/.envs/<user>/``), and the launcher asks the server for one
over a Unix socket (its path in ``$TLAUNCH_ENV_SEALER``; the server knows the
asker by the socket's peer credentials, never by what it says)::

    launcher (the user's account)                  server (root)
    ────────────────────────────────────────      ─────────────────────────────────────────────
    {"env": "<digest>"}  ──────────────────────▶  the environment's lock taken (one build at a time)
                                                   sealed already: {"ready": path}   (done)
                         ◀──────────────────────   else a folder of the user's at path: {"build": path}
    pip install into path (as the user), marker
    written last, then {"built": true}  ───────▶  copied by root into new files of root's, read-only,
                                                   swapped in at path
                         ◀──────────────────────   {"ready": path}, the lock released

The build runs as the user (never a user's ``pip``/``setup.py`` as root), at the
path the sealed environment keeps (its scripts name it). Root *copies* what was
built: a descriptor a job of the user opened on a file while it was being
built writes into the user's old file, never into the sealed one. A connection
that ends before ``built`` (the launcher stopped, pip failed) ends the build:
the server removes its folder.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any, TextIO

from tlaunch.runtime.pyenv import (
    Built,
    EnvBuildError,
    RuntimeEnv,
    build,
    env_dir,
    python_of,
)

__all__ = ["LINE_LIMIT", "SEALER_VARIABLE", "prepare_sealed", "sealer"]

SEALER_VARIABLE = "TLAUNCH_ENV_SEALER"
"""Names the sealer's socket in a job's launcher (set by the server under ``--unix-users``)."""
LINE_LIMIT = 4096
"""The longest message either side sends (one JSON object on one line)."""


def sealer(environ: dict[str, str] | None = None) -> str | None:
    """The sealer's socket, if the job's server keeps its environments (None: the launcher builds its own)."""
    return (os.environ if environ is None else environ).get(SEALER_VARIABLE) or None


class _Store:
    """A connection to the sealer; its troubles raise :class:`EnvBuildError`, naming it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.conn.connect(path)
        except OSError as exc:
            self.conn.close()
            raise EnvBuildError(f"cannot reach the job server's environment store {path}: {exc}") from None
        self.reader = self.conn.makefile("rb")

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            self.conn.sendall(json.dumps(message).encode() + b"\n")
            line = self.reader.readline(LINE_LIMIT)
        except OSError as exc:
            raise EnvBuildError(f"the job server's environment store {self.path} went away: {exc}") from None
        if not line:
            raise EnvBuildError(f"the job server's environment store {self.path} closed the connection")
        answer = json.loads(line)
        if "error" in answer:
            raise EnvBuildError(f"the job server's environment store refused it: {answer['error']}")
        return dict(answer)

    def close(self) -> None:
        self.reader.close()
        self.conn.close()


def prepare_sealed(path: str, env: RuntimeEnv, out: TextIO | None = None) -> Built:
    """``env``'s environment from the sealer at ``path``: sealed already, or built now by this process
    into the folder the server gives, then sealed by it.

    Raises:
        EnvBuildError: pip failed (its output is in the error), or the server refused or went away.
    """
    digest = os.path.basename(env_dir("/", env.key))  # names the key, this interpreter and platform
    store = _Store(path)
    try:
        answer = store.ask({"env": digest})
        if "ready" in answer:
            return Built(python_of(answer["ready"]), answer["ready"], built=False)
        folder = str(answer["build"])
        build(folder, env, out, user_site=False)  # nothing of ~/.local: a folder the user's jobs can write
        ready = str(store.ask({"built": True})["ready"])
        return Built(python_of(ready), ready, built=True)
    finally:
        store.close()  # before "built": the server removes what was made
