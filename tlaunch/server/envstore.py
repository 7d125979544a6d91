"""``--unix-users``: the users' runtime environments on this machine, built by each user and sealed by root.

A job's launcher runs as its user's account; an environment that account
owned could be made writable again by any of the user's jobs. So the server
keeps them (:mod:`tlaunch.server.unixusers` for the folders)::

    <home>/users/.envs/<user>/           root, 0700, ACL u:<user>:r-x: no one else enters
    <home>/users/.envs/<user>/<digest>/  root's files, 0555/0444: the sealed environment
    <home>/users/.envs/<user>/<digest>.lock   root's, 0444: builds one at a time; a job holds it shared

:class:`EnvStore` listens on ``<home>/users/.envs/.sealer`` (a Unix socket any
local process may reach; the asker is whoever the kernel says is at the other
end, ``SO_PEERCRED``, and must be one of the server's users) and speaks the
protocol of :mod:`tlaunch.control.starting.sealedenv`: it takes the
environment's lock, answers a sealed environment at once, else makes its
folder the user's, lets the user's launcher build in it (pip runs as the
user, never as root), then copies what was built into root's files
(:func:`~tlaunch.server.sealcopy.copy_sealed`) and swaps the copy in. From then
no job of any user can write into it; the user's jobs read and run it.

Per user, not shared between users: a user's build runs their requirements'
own install code, and a job of theirs that runs meanwhile can write into the
folder until it is sealed; so an environment is only ever used by the user
who built it. :meth:`EnvStore.collect` removes the unused ones (root's own
files: removed by root; a user's own folder, ``<home>/users/<user>/envs``
where SLURM jobs build, is collected by a process of that user's).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
from collections import Counter
from typing import Any, BinaryIO

from tlaunch.control.starting.envs import envs_root
from tlaunch.control.starting.sealedenv import LINE_LIMIT
from tlaunch.runtime.envgc import collect
from tlaunch.runtime.pyenv import MARKER
from tlaunch.server.sealcopy import Refused, copy_sealed
from tlaunch.server.unixusers import UnixUsers

__all__ = ["EnvStore"]

log = logging.getLogger(__name__)
_DIGEST = re.compile(r"[0-9a-f]{64}")
_FIRST_LINE_S = 30.0  # seconds a connection has to say what it asks


class EnvStore:
    """The users' sealed runtime environments, and the socket their launchers ask (module docstring).

    Args:
        unix: the server's accounts and folders.
        max_bytes: the largest environment sealed (the server's ``--env-keep-gb``).
        per_user: connections one user may hold at once (builds and looks; past it, refused).
    """

    def __init__(self, unix: UnixUsers, max_bytes: int, per_user: int = 64) -> None:
        self.unix = unix
        self.max_bytes = max_bytes
        self.per_user = per_user
        self._open: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    # -- the service ------------------------------------------------------------------------

    def start(self) -> None:
        """Remove what a server before this one left half done, then listen."""
        for name in self.unix.accounts:
            self._tidy(self.unix.envs_of(name))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.unix.sealer)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.unix.sealer)
        os.chmod(self.unix.sealer, 0o666)  # anyone may connect: the peer's uid decides
        listener.listen(128)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="env sealer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening (a build in progress fails: its launcher's connection ends)."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.unix.sealer)

    def _accept(self) -> None:
        while (listener := self._listener) is not None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            with self._lock:
                full = self._open[uid] >= self.per_user
                if not full:
                    self._open[uid] += 1
            if full:
                with contextlib.suppress(OSError):
                    _send(conn, {"error": f"{self.per_user} of your environments are asked for already"})
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, uid), name="env seal", daemon=True).start()

    def _serve(self, conn: socket.socket, uid: int) -> None:
        try:
            with conn, conn.makefile("rb") as reader:
                self._answer(conn, reader, uid)
        except OSError as exc:  # the asker went away, or said nothing in time
            log.warning("a runtime environment request of uid %d ended: %s", uid, exc)
        except Exception:  # one connection's trouble is its own; the service goes on
            log.exception("answering a runtime environment request of uid %d", uid)
        finally:
            with self._lock:
                self._open[uid] -= 1

    def _answer(self, conn: socket.socket, reader: BinaryIO, uid: int) -> None:
        account = next((a for a in list(self.unix.accounts.values()) if a.uid == uid), None)
        if account is None:
            _send(conn, {"error": f"uid {uid} is not a user of this server"})
            return
        conn.settimeout(_FIRST_LINE_S)
        request = _request(reader.readline(LINE_LIMIT))
        digest = request.get("env")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            _send(conn, {"error": f"ask for an environment by its digest (64 hex digits), not {digest!r}"})
            return
        conn.settimeout(None)  # a build takes as long as pip does
        root = self.unix.envs_of(account.name)
        path = os.path.join(root, digest)
        lock = os.open(path + ".lock", os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o444)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; never while the collector removes it
            if _sealed(path):
                with contextlib.suppress(OSError):
                    os.utime(os.path.join(path, MARKER))  # used now
                _send(conn, {"ready": path})
                return
            _remove(path)  # half-made: a build that never ended
            os.mkdir(path, 0o700)
            os.chown(path, account.uid, account.gid)
            _send(conn, {"build": path})
            if _request(reader.readline(LINE_LIMIT)) != {"built": True}:
                return  # the launcher stopped, or pip failed: what it made goes
            try:
                size = self._seal(root, digest, account.uid)
            except Refused as exc:
                _send(conn, {"error": f"the environment built in {path} cannot be sealed: {exc}"})
                return
            log.warning("sealed the runtime environment %s of %s (%d bytes)", path, account.name, size)
            _send(conn, {"ready": path})
        finally:
            if not _sealed(path):
                _remove(path)
            os.close(lock)

    def _seal(self, root: str, digest: str, uid: int) -> int:
        """Copy ``uid``'s ``<root>/<digest>`` into root's files and swap the copy in; its bytes."""
        path = os.path.join(root, digest)
        tag = secrets.token_hex(6)
        staging, trash = (os.path.join(root, f".{what}-{digest}-{tag}") for what in ("sealing", "trash"))
        try:
            size = copy_sealed(path, staging, max_bytes=self.max_bytes, owner=uid)
            _mark(os.path.join(staging, MARKER), size)
            os.rename(path, trash)
            os.rename(staging, path)
            return size
        finally:
            _remove(staging)
            _remove(trash)

    def _tidy(self, root: str) -> None:
        """Remove what no build goes on with any more: copies half made, folders a user's build left."""
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(root):
                path = os.path.join(root, name)
                half_made = _DIGEST.fullmatch(name) is not None and not _sealed(path)
                if half_made or name.startswith((".sealing-", ".trash-")):
                    _remove(path)

    # -- collecting ---------------------------------------------------------------------------

    def collect(self, keep_bytes: int, keep_days: float) -> list[str]:
        """Remove the environments nobody used for ``keep_days`` or past ``keep_bytes`` a user (the least
        recently used first; never one a job holds or a build makes); what was removed.

        A user's own folder of environments (SLURM's builds) is collected by a process of the user's:
        root never removes or opens files in a folder a user could have put a link in.
        """
        removed: list[str] = []
        for name, account in list(self.unix.accounts.items()):
            removed += collect(self.unix.envs_of(name), MARKER, keep_bytes, keep_days, owner=0).removed
            own = envs_root(self.unix.home_of(name))
            if not os.path.isdir(own):
                continue
            argv = [sys.executable, "-m", "tlaunch.runtime.envgc", own, MARKER,
                    "--keep-bytes", str(keep_bytes), "--keep-days", str(keep_days)]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd="/",
                                  env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": account.home},
                                  **account.drop())  # fmt: skip
            try:
                removed += json.loads(done.stdout.strip().splitlines()[-1])["removed"]
            except (IndexError, ValueError, KeyError):
                log.warning("collecting %s as %s failed: %s", own, name, done.stderr.strip()[-500:])
        return removed


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _request(line: bytes) -> dict[str, Any]:
    """A line of the asker's as a JSON object (empty: the connection ended, or it said nothing sensible)."""
    try:
        data = json.loads(line) if line.endswith(b"\n") else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _sealed(path: str) -> bool:
    """Whether ``path`` is a sealed environment: root's folder, root's marker in it."""
    try:
        top, marker = os.lstat(path), os.lstat(os.path.join(path, MARKER))
    except OSError:
        return False
    return stat.S_ISDIR(top.st_mode) and stat.S_ISREG(marker.st_mode) and top.st_uid == marker.st_uid == 0


def _remove(path: str) -> None:
    """Remove ``path`` (a folder: what is in it too, never through a link), if it is there."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)  # descriptor-based on Linux: a link swapped in is removed, not followed
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _mark(marker: str, size: int) -> None:
    """Root's marker in the copy (root's files): what the user's build said, with the bytes root counted."""
    try:
        with open(os.open(marker, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
            said = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        raise Refused("its build did not finish (no marker)") from None
    if not isinstance(said, dict):
        raise Refused("its marker is not what a build writes")
    with open(marker, "w", encoding="utf-8") as f:  # root writes its 0444 file
        json.dump({**said, "bytes": size}, f)
