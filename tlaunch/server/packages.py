"""The package store: trainer packages (a zip or tar of a folder), each user's own, read-only, checked.

::

    <root>/<user>/<sha256>/files/...      a user's packages (ids are per user: another user's
    <root>/<user>/<sha256>/.tree          hash is not found by guessing it); .tree: each file's
    <root>/.shared/<sha256>/...           sha256; packages shared on purpose (?shared=true)

An upload is kept once per user, under its sha256: a package the user already
has is not stored again. It is written to a file as it arrives
(:meth:`PackageStore.receive`), never held in memory whole, and unpacked with
:mod:`tlaunch.server.unpack`'s checks. Once stored it is read-only (files
0400, folders 0500) and each file's hash is kept; a job never runs in it:
:meth:`PackageStore.checkout` copies it into the job's run folder, checking
every file against its kept hash on the way (a package changed on disk is
refused and removed, :class:`ChangedPackage`), so a job that writes into its
working directory changes its own copy only, and a second job of the same
bytes sees the files as they were uploaded. An upload cut off (the server
killed as it arrived) leaves ``.incoming-*``/``.upload-*`` files, removed when
the store is opened again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from tlaunch.server.unpack import BadPackage, Unpacker

__all__ = ["SHARED", "BadPackage", "ChangedPackage", "Package", "PackageStore", "Packages", "Upload"]

SHARED = ".shared"
"""The store of packages shared on purpose (any user finds them by id)."""
_TREE, _SIZE = ".tree", ".size"
_ID = re.compile(r"^[0-9a-f]{64}$")
Chown = Callable[[str], None]
"""Gives a path of a checkout to the account whose job it is (``--unix-users``)."""


class ChangedPackage(RuntimeError):
    """A stored package whose files no longer have the hashes they had when it was stored."""


@dataclass(frozen=True)
class Package:
    """A stored package: its id (the sha256 of the upload), size in bytes and unpacked folder."""

    package_id: str
    sha256: str
    size: int
    path: str


class PackageStore:
    """One user's packages under ``root`` (see the module docstring)."""

    def __init__(self, root: str, *, max_bytes: int = 512 << 20, max_members: int = 10_000) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_members = max_members
        self._unpacker = Unpacker(max_bytes, max_members)
        os.makedirs(root, mode=0o700, exist_ok=True)
        for name in os.listdir(root):  # uploads a killed server was receiving or unpacking
            if name.startswith((".incoming-", ".upload-")):
                _remove(os.path.join(root, name))

    def get(self, package_id: str) -> Package | None:
        """The package of that id, if stored."""
        if not _ID.match(package_id):
            return None
        path = os.path.join(self.root, package_id)
        try:
            with open(os.path.join(path, _SIZE)) as f:
                size = int(f.read())
        except (OSError, ValueError):
            return None
        return Package(package_id, package_id, size, os.path.join(path, "files"))

    def receive(self) -> Upload:
        """A file of the store's own to write an upload into, as it arrives (see :class:`Upload`)."""
        return Upload(self)

    def add(self, data: bytes) -> tuple[Package, bool]:
        """Store the archive ``data``; the package and whether it was new.

        Raises:
            BadPackage: too large, not a zip or tar, or a member the store refuses (named).
        """
        with self.receive() as upload:
            upload.write(data)
            return upload.store()

    def add_file(self, path: str, digest: str, size: int) -> tuple[Package, bool]:
        """Store the archive in file ``path`` (its sha256 ``digest``, ``size`` bytes).

        Raises:
            BadPackage: too large, not a zip or tar, or a member the store refuses (named).
        """
        if size > self.max_bytes:
            raise BadPackage(f"the package is {size} bytes, over the limit of {self.max_bytes}")
        known = self.get(digest)
        if known is not None:
            return known, False
        staging = tempfile.mkdtemp(prefix=".upload-", dir=self.root)
        try:
            files = os.path.join(staging, "files")
            os.mkdir(files, 0o700)
            self._unpacker.unpack(path, files)
            _write_once(os.path.join(staging, _TREE), json.dumps(_tree(files), sort_keys=True))
            _write_once(os.path.join(staging, _SIZE), str(size))  # last: a package without it is none
            _freeze(files)
            try:
                os.rename(staging, os.path.join(self.root, digest))
            except OSError:  # the same upload, stored at the same moment by another request
                _remove(staging)
        except BaseException:
            _remove(staging)
            raise
        package = self.get(digest)
        assert package is not None
        return package, True

    def checkout(self, package: Package, dest: str, chown: Chown | None = None) -> str:
        """Copy ``package``'s files to the new folder ``dest`` (folders 0700, files 0600), each checked
        against the hash it was stored with; ``dest``.

        Args:
            chown: called with each path made (the folder first), before ``dest`` appears.

        Raises:
            ChangedPackage: a file was changed, added or removed since the package was stored (it
                is removed from the store: upload it again).
        """
        staging = tempfile.mkdtemp(prefix=".checkout-", dir=os.path.dirname(dest))
        try:
            found = _copy(package.path, staging, chown)
            try:
                with open(os.path.join(os.path.dirname(package.path), _TREE), encoding="utf-8") as f:
                    kept = json.load(f)
            except (OSError, ValueError):
                kept = None
            if found != kept:
                _remove(os.path.dirname(package.path))
                raise ChangedPackage(
                    f"package {package.package_id} changed on disk since it was stored (its files' "
                    "hashes differ): it was removed from the store; upload it again"
                )
            os.rename(staging, dest)
        except BaseException:
            _remove(staging)
            raise
        return dest


class Packages:
    """Every user's :class:`PackageStore` under ``root``, and the one of packages shared on purpose.

    Args:
        root: the stores' folder (``<home>/server/packages``).
        max_bytes, max_members: each upload's limits.
    """

    def __init__(self, root: str, *, max_bytes: int = 512 << 20, max_members: int = 10_000) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_members = max_members
        self._stores: dict[str, PackageStore] = {}
        os.makedirs(root, mode=0o700, exist_ok=True)
        for name in os.listdir(root):  # each store removes what a killed server left half-made
            if os.path.isdir(os.path.join(root, name)) and not _ID.match(name) and not name.startswith("."):
                self.of(name)
        self.of(SHARED)

    def of(self, owner: str) -> PackageStore:
        """``owner``'s store (:data:`SHARED`: the shared one)."""
        store = self._stores.get(owner)
        if store is None:
            if owner in ("", ".", "..") or "/" in owner or "\0" in owner:
                raise ValueError(f"{owner!r} cannot name a package store")
            path = os.path.join(self.root, owner)
            store = PackageStore(path, max_bytes=self.max_bytes, max_members=self.max_members)
            self._stores[owner] = store
        return store

    def find(self, owner: str, package_id: str) -> tuple[PackageStore, Package] | None:
        """The package ``owner`` may use by that id (their own, else a shared one), and its store."""
        for store in (self.of(owner), self.of(SHARED)):
            package = store.get(package_id)
            if package is not None:
                return store, package
        return None


def _tree(folder: str) -> dict[str, str]:
    """Each file of ``folder`` (relative path) and its sha256; each folder as ``"/"``."""
    out: dict[str, str] = {}
    for top, _dirs, files in os.walk(folder):
        rel = os.path.relpath(top, folder)
        if rel != ".":
            out[rel] = "/"
        for name in files:
            out[os.path.normpath(os.path.join(rel, name))] = _sha256(os.path.join(top, name))
    return out


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _copy(src: str, dest: str, chown: Chown | None) -> dict[str, str]:
    """Copy the files of ``src`` into the folder ``dest`` (hashing them as they go); their tree."""
    out: dict[str, str] = {}
    if chown is not None:
        chown(dest)
    for top, _dirs, files in os.walk(src):
        rel = os.path.relpath(top, src)
        into = os.path.normpath(os.path.join(dest, rel))
        if rel != ".":
            out[rel] = "/"
            os.mkdir(into, 0o700)
            if chown is not None:
                chown(into)
        for name in files:
            source = os.path.join(top, name)
            if not stat.S_ISREG(os.lstat(source).st_mode):
                out[os.path.normpath(os.path.join(rel, name))] = "not a file"
                continue
            target = os.path.join(into, name)
            digest = hashlib.sha256()
            with (
                open(source, "rb") as f,
                open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as o,
            ):
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                    o.write(chunk)
            if chown is not None:
                chown(target)
            out[os.path.normpath(os.path.join(rel, name))] = digest.hexdigest()
    return out


def _write_once(path: str, text: str) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "w", encoding="utf-8") as f:
        f.write(text)


def _freeze(folder: str) -> None:
    """Make ``folder`` read-only: files 0400, folders 0500 (deepest first)."""
    for top, _dirs, files in os.walk(folder, topdown=False):
        for name in files:
            os.chmod(os.path.join(top, name), 0o400)
        os.chmod(top, 0o500)


def _remove(path: str) -> None:
    """Remove ``path`` (a file, or a folder even if read-only)."""
    if os.path.isdir(path) and not os.path.islink(path):
        for top, _dirs, _ in os.walk(path):
            with contextlib.suppress(OSError):
                os.chmod(top, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class Upload:
    """An upload being received: written to a 0600 file of the store, hashed as it comes, removed at the end.

    ::

        with store.receive() as upload:
            for chunk in body:
                upload.write(chunk)       # BadPackage once over the store's limit
            package, new = upload.store()
    """

    def __init__(self, store: PackageStore) -> None:
        self._store = store
        fd, self.path = tempfile.mkstemp(prefix=".incoming-", dir=store.root)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``.

        Raises:
            BadPackage: the upload is now over the store's limit.
        """
        self.size += len(chunk)
        if self.size > self._store.max_bytes:
            raise BadPackage(f"the package is over the limit of {self._store.max_bytes} bytes")
        self._hash.update(chunk)
        self._file.write(chunk)

    def store(self) -> tuple[Package, bool]:
        """Keep what was received as a package; the package and whether it was new.

        Raises:
            BadPackage: see :meth:`PackageStore.add_file`.
        """
        self._file.close()
        return self._store.add_file(self.path, self._hash.hexdigest(), self.size)

    def __enter__(self) -> Upload:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._file.close()
        os.unlink(self.path)
