"""The package store: trainer packages (a zip or tar of a folder), content-addressed, unpacked safely.

An upload is kept once, under its sha256 (``<store>/<sha256>/``, folders 0700,
files 0600): a package the store already has is not stored again. Unpacking
refuses what could escape the package's folder or exhaust the disk: absolute
paths, ``..``, symbolic and hard links, device files and FIFOs, more than
``max_members`` members or ``max_bytes`` bytes once unpacked (a zip bomb).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = ["BadPackage", "Package", "PackageStore"]


class BadPackage(ValueError):
    """An upload that is not a package the store can keep (the message says why)."""


@dataclass(frozen=True)
class Package:
    """A stored package: its id (the sha256 of the upload), size in bytes and unpacked folder."""

    package_id: str
    sha256: str
    size: int
    path: str


class PackageStore:
    """Packages under ``root`` (see the module docstring)."""

    def __init__(self, root: str, *, max_bytes: int = 512 << 20, max_members: int = 10_000) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_members = max_members
        os.makedirs(root, mode=0o700, exist_ok=True)

    def get(self, package_id: str) -> Package | None:
        """The package of that id, if stored."""
        if len(package_id) != 64 or any(c not in "0123456789abcdef" for c in package_id):
            return None
        path = os.path.join(self.root, package_id)
        marker = os.path.join(path, ".size")
        if not os.path.isfile(marker):
            return None
        with open(marker) as f:
            size = int(f.read())
        return Package(package_id, package_id, size, os.path.join(path, "files"))

    def add(self, data: bytes) -> tuple[Package, bool]:
        """Store the archive ``data``; the package and whether it was new.

        Raises:
            BadPackage: not a zip or tar, or a member the store refuses (named).
        """
        if len(data) > self.max_bytes:
            raise BadPackage(f"the package is {len(data)} bytes, over the limit of {self.max_bytes}")
        digest = hashlib.sha256(data).hexdigest()
        known = self.get(digest)
        if known is not None:
            return known, False
        staging = tempfile.mkdtemp(prefix=".upload-", dir=self.root)
        try:
            files = os.path.join(staging, "files")
            os.mkdir(files, 0o700)
            self._unpack(data, files)
            with open(os.path.join(staging, ".size"), "w") as f:
                f.write(str(len(data)))
            try:
                os.rename(staging, os.path.join(self.root, digest))
            except OSError:  # the same upload, stored at the same moment by another request
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        package = self.get(digest)
        assert package is not None
        return package, True

    # -- unpacking ------------------------------------------------------------
    def _unpack(self, data: bytes, dest: str) -> None:
        if zipfile.is_zipfile(io.BytesIO(data)):
            self._unzip(data, dest)
            return
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
                self._untar(archive, dest)
        except tarfile.TarError as exc:
            raise BadPackage(f"the package is neither a zip nor a readable tar archive ({exc})") from None

    def _check(self, name: str, count: int, total: int) -> str:
        if count > self.max_members:
            raise BadPackage(f"the package has more than {self.max_members} members")
        if total > self.max_bytes:
            raise BadPackage(f"the package unpacks to more than {self.max_bytes} bytes")
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or name.startswith(("/", "\\")) or "\\" in name:
            raise BadPackage(f"member {name!r} would leave the package's folder")
        return str(path)

    def _unzip(self, data: bytes, dest: str) -> None:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            total = 0
            for count, info in enumerate(archive.infolist(), 1):
                total += info.file_size
                rel = self._check(info.filename, count, total)
                kind = stat.S_IFMT(info.external_attr >> 16)
                if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                    raise BadPackage(f"member {info.filename!r} is a link or a device, not a file")
                target = os.path.join(dest, rel)
                if info.is_dir():
                    os.makedirs(target, mode=0o700, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
                written = 0
                with (
                    archive.open(info) as src,
                    open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out,
                ):
                    while chunk := src.read(1 << 20):
                        written += len(chunk)
                        if written > info.file_size or total - info.file_size + written > self.max_bytes:
                            raise BadPackage(f"member {info.filename!r} unpacks to more than it says")
                        out.write(chunk)

    def _untar(self, archive: tarfile.TarFile, dest: str) -> None:
        total = 0
        for count, member in enumerate(archive, 1):
            total += member.size
            rel = self._check(member.name, count, total)
            if not (member.isfile() or member.isdir()):
                raise BadPackage(f"member {member.name!r} is a link or a device, not a file")
            target = os.path.join(dest, rel)
            if member.isdir():
                os.makedirs(target, mode=0o700, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            src = archive.extractfile(member)
            assert src is not None
            with src, open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                shutil.copyfileobj(src, out)
